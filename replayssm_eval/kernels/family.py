"""`KernelFamily`: what code outside `kernels/` needs to know about one recurrence family.

Each family package (`kernels/mamba2`, `kernels/gdn`, ...) defines `FAMILY = KernelFamily(...)` in
its `__init__`; `get_family(name)` imports it. Everything outside `kernels/` reaches a family's
kernels only through this description, so adding a family means writing its package and adding
one line to `FAMILY_PACKAGES`.

Call convention, shared by every kernel entry point: the HF tensors in the order of `inputs`, batch
first and with a time dim ([B, T, ...]; per-head parameters such as Mamba-2's A and D without),
then the state (the FP32 state in `state_layout` at the anchor, or a ReplayState), then the config:

    out, state = fam.decode_reference(*tensors, state, config, layer_idx=..., seq_ids=..., compute_dtype=...)
    out, state = fam.chunked(*tensors, state, config, ..., backend="torch" | "triton")
    out, state = fam.decode_step(*tensors, state, config, layer_idx=..., seq_ids=...)   # T == 1, Triton
    out = fam.verify(*drafts, state, config, layer_idx=...)    # Triton, output only, state unchanged
    out = fam.conventional_step(*tensors, fp32_state)          # one token, no time dim; FP32 state in
                                                               # `stored_layout`, updated in place
    out = fam.fixed_step(static_state, tensors, fold, folds)   # T == 1, fixed buffers (`kernels.static_step`)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from replayssm_eval.replay.state import ReplayState

# family name -> package defining FAMILY; a new family adds one line
FAMILY_PACKAGES = {
    "mamba2": "replayssm_eval.kernels.mamba2",
    "gdn": "replayssm_eval.kernels.gdn",
    "kda": "replayssm_eval.kernels.kda",
}


@dataclass(frozen=True)
class KernelFamily:
    """One recurrence family: its inputs, its kernels and what code outside `kernels/` needs to call them.

    name: the family's name (`get_family`).
    inputs: the kernel input names, in call order; shapes: {name: shape} of each ([B, T, ...] or per head).
    state_layout: shape of the FP32 state as HF's cache holds it (the anchor the kernels take).
    test_shapes: {name: {dim letter: size}}: small geometries for checks ("small", "grouped"), with batch B.
    closed_fold: whether the config's `#closed` fold applies to this family.
    decode_reference, speculative_decode_reference, chunked, decode_step, verify, conventional_step:
        the kernels, in the call convention of the module docstring.
    hf_state: a ReplayState's S_hi (its checkpoint) as an FP32 tensor in `state_layout`.
    stored_layout: an FP32 state in `state_layout` -> the layout ReplayState's copies are stored in.
    hf_layout: a state in the stored layout -> `state_layout` (`stored_layout`'s inverse).
    random_inputs: (test shape, tokens, generator) -> ({name: tensor}, FP32 anchor state in `state_layout`),
        test inputs in the ranges the HF layers produce (on CPU).
    head_state: (head_dim, state_dim) of a geometry -> one head's state (rows, cols) in `state_layout`.
    entry_elements: (heads, head_dim, state_dim, groups, fold) -> elements of one buffer entry
        (read at a non-flush token, read at the flush, written).
    replay_state: (tensors, state, config, layer_idx, seq_ids) -> the checked ReplayState the kernels start
        from (checkpoint 0 written from an FP32 anchor in `state_layout`, or the carried ReplayState).
    log_decays: (tensors in `inputs` order, carried ReplayState or None) -> (log-decay per token and head
        [B, T, H], log-decay of the carried buffer entries [B, cap, H] or None): what `replay.skip` reads.
    live_state: (tensors, carried ReplayState, config) -> the FP32 state a flush now would fold, unrounded: S_hi
        with the buffered entries folded in ([B, H, P, N], the formats' layout); what a round trip stores.
    """

    name: str
    inputs: tuple[str, ...]
    shapes: Mapping[str, str]
    state_layout: str
    test_shapes: Mapping[str, Mapping[str, int]]
    closed_fold: bool
    decode_reference: Callable
    speculative_decode_reference: Callable
    chunked: Callable
    decode_step: Callable
    verify: Callable
    conventional_step: Callable
    hf_state: Callable[[ReplayState], torch.Tensor]
    stored_layout: Callable[[torch.Tensor], torch.Tensor]
    hf_layout: Callable[[torch.Tensor], torch.Tensor]
    random_inputs: Callable
    head_state: Callable[[int, int], tuple[int, int]]
    entry_elements: Callable[..., tuple[int, int, int]]
    replay_state: Callable[..., ReplayState]
    log_decays: Callable[[tuple, ReplayState | None], tuple[torch.Tensor, torch.Tensor | None]]
    live_state: Callable[[tuple, ReplayState, object], torch.Tensor]
    fixed_step: Callable[..., torch.Tensor] | None


def family_names() -> tuple[str, ...]:
    return tuple(FAMILY_PACKAGES)


def get_family(name: str) -> KernelFamily:
    """The registered family `name`; ValueError listing the known families otherwise."""
    if name not in FAMILY_PACKAGES:
        raise ValueError(f"unknown kernel family {name!r}; known: {', '.join(FAMILY_PACKAGES)}")
    return importlib.import_module(FAMILY_PACKAGES[name]).FAMILY


def all_families() -> tuple[KernelFamily, ...]:
    return tuple(get_family(name) for name in FAMILY_PACKAGES)


"""A state round trip on one layer's carried state (docs/semantics.md, "State round trips").

The live FP32 state (the anchor, or S_hi with the ring folded in: `KernelFamily.live_state`) is stored in
the round trip's format and decoded; the layer continues from it as from a new anchor: a checkpoint is
written from it under the config (with the newest checkpoint's index, so later flushes draw the SR bits they
would draw without the round trip), the ring is emptied and the window phase restarts at 0.
"""

from __future__ import annotations

import dataclasses

import torch

from replayssm_eval.formats.packed import PackedState
from replayssm_eval.kernels.family import KernelFamily
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.keys import ROUND_TRIP_COPY, sr_keys
from replayssm_eval.replay.state import ReplayState, encode_keyed, write_checkpoint_packed


def stored_and_restored(live: torch.Tensor, fmt, keys: torch.Tensor | None, checkpoint: torch.Tensor) -> torch.Tensor:
    """live [B, H, P, N] (formats' layout) encoded in the round trip's format `fmt` and decoded, fp32 in live's memory
    layout (a format along head_dim decodes a transposed view, which Mamba-2's Triton step, allocating its fold
    output with S_hi's strides, would write through; and a round trip through FP32 must leave the next call's sums,
    whose order follows the layout, as they were); SR bits from the Philox keys [B] of (seed, layer, sequence,
    `ROUND_TRIP_COPY`) (None for a deterministic format) at the checkpoint indices [B]."""
    restored = torch.empty_like(live, dtype=torch.float32)  # live's strides (preserve_format)
    return restored.copy_(fmt.decode(encode_keyed(live.float(), fmt, keys, checkpoint)))


def round_trip(family: KernelFamily, tensors: tuple, state, config: ReplayConfig, layer_idx: int,
               seq_ids: torch.Tensor, rows: torch.Tensor) -> ReplayState:
    """The layer's ReplayState after a round trip of the sequences `rows` ([B] bool); the other rows as carried.

    tensors: the next call's kernel inputs (`family.inputs`, T >= 1; Mamba-2 reads A); state: the FP32 anchor in
    `family.state_layout` or a carried ReplayState.
    """
    base = family.replay_state(tensors, state, config, layer_idx, seq_ids)  # the anchor: checkpoint 0 from it
    anchor = not isinstance(state, ReplayState)
    live = family.stored_layout(state) if anchor else family.live_state(tensors, base, config)  # [B, H, P, N]
    fmt = config.round_trip.format
    keys = sr_keys(config.seed, layer_idx, base.seq_ids, ROUND_TRIP_COPY) if fmt.is_stochastic else None
    restored = stored_and_restored(live, fmt, keys, base.checkpoint)
    hi, lo, packed = write_checkpoint_packed(restored, config, layer_idx, base.seq_ids, base.checkpoint)
    pick = lambda new, old: torch.where(rows.view(-1, *[1] * (old.dim() - 1)), new, old)  # noqa: E731
    old_packed = base.lo_packed
    if anchor and old_packed is None and not bool(rows.all()):  # checkpoint 0's packed read copy, for the other rows
        old_packed = write_checkpoint_packed(live.float(), config, layer_idx, base.seq_ids, base.checkpoint)[2]
    new_hi = pick(hi, base.hi)
    schedule = dataclasses.replace(base.schedule, count=torch.where(rows, 0, base.schedule.count))
    return ReplayState(
        hi=new_hi, lo=new_hi if config.shared else pick(lo, base.lo),
        buffer={name: pick(torch.zeros_like(t), t) for name, t in base.buffer.items()},
        schedule=schedule, checkpoint=base.checkpoint, seq_ids=base.seq_ids, layer=base.layer,
        lo_packed=_pick_packed(rows, packed, old_packed),
    )


def _pick_packed(rows: torch.Tensor, new: PackedState, old: PackedState | None) -> PackedState | None:
    """`new` for the sequences `rows`, `old` for the rest (every field leads with the batch dim)."""
    if bool(rows.all()):
        return new
    if old is None:
        return None
    fields = [None if o is None else torch.where(rows.view(-1, *[1] * (o.dim() - 1)), n, o)
              for o, n in zip(old.tensors(), new.tensors())]
    return PackedState(old.format, old.shape, *fields)

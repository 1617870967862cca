"""ReplaySSM split-precision decoding of a Mamba-2 layer: step reference, chunked teacher-forced form, Triton.

    from replayssm_eval.kernels.mamba2 import chunked, decode_reference
    y, state = decode_reference(x, dt, A, B, C, D, initial_state, "nvfp4/fp16sr@16")
    y2, state2 = chunked(x2, dt2, A, B2, C2, D, state, "nvfp4/fp16sr@16")  # continues the same sequences

Shapes (Hugging Face): x [B, T, H, P], dt [B, T, H] (after softplus and bias), A [H] (negative),
B and C [B, T, G, N], D [H], state [B, H, P, N].

Layering, one way: `_common` <- `reference` <- `chunked` (torch) <- `triton_step` (decode kernels) <-
`triton_chunk` (the chunked scan) <- `fixed_step` (`KernelFamily.fixed_step`); `chunked` with its
backend choice is defined here, above them.
"""

from __future__ import annotations

import torch

from replayssm_eval.kernels.family import KernelFamily
from replayssm_eval.kernels.mamba2 import triton_chunk, triton_step
from replayssm_eval.kernels.mamba2._common import prepare_inputs
from replayssm_eval.kernels.mamba2.fixed_step import fixed_step
from replayssm_eval.kernels.mamba2.chunked import chunked_torch
from replayssm_eval.kernels.mamba2.reference import decode_reference, live_state, speculative_decode_reference
from replayssm_eval.replay.schedule import plan_tokens
from replayssm_eval.replay.state import chunked_backend

BACKENDS = ("torch", "triton")


def chunked(x, dt, A, B, C, D, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32,
            backend="torch"):
    """Teacher-forced ReplaySSM over T tokens; same arguments and results as `decode_reference`.

    backend: "torch" (loop over checkpoints, a few tensor ops each) or "triton" (one kernel launch
    does the state passing with in-loop quantization; see `mamba2.triton_chunk.chunked_triton_prepared`).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    inp = prepare_inputs(x, dt, A, B, C, D, initial_state, config, layer_idx, seq_ids, compute_dtype)
    plan, after = plan_tokens(inp.config, inp.state.schedule, inp.x.shape[1], inp.state.seq_ids)
    carried = backend == "triton" and triton_chunk.feedback_in_kernel(inp.config, (inp.dims[3], inp.dims[5]))
    if chunked_backend(inp.config, backend, "mamba2", carried) == "triton":
        return triton_chunk.chunked_triton_prepared(inp, plan, after)
    return chunked_torch(inp, plan, after)


def decode_step(x, dt, A, B, C, D, initial_state, config, *, layer_idx=0, seq_ids=None):
    """`decode_step_triton` in the family call convention: one token, x [B, 1, H, P], ...; y [B, 1, H, P]."""
    if x.shape[1] != 1:
        raise ValueError(f"decode_step decodes one token: x has T={x.shape[1]}, expected 1")
    y, state = triton_step.decode_step_triton(x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D, initial_state, config,
                                          layer_idx=layer_idx, seq_ids=seq_ids)
    return y[:, None], state


def _random_inputs(dims, tokens, gen):
    """Test inputs: dims {B, H, P, G, N}; a slowly decaying head 0, where state errors accumulate."""
    batch, heads, head_dim, groups, d_state = (dims[d] for d in "BHPGN")
    rand = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    A = -torch.exp(rand(heads))  # [H]
    A[0] = -0.02
    inputs = {"x": rand(batch, tokens, heads, head_dim),
              "dt": torch.nn.functional.softplus(rand(batch, tokens, heads) - 1.0), "A": A,
              "B": rand(batch, tokens, groups, d_state), "C": rand(batch, tokens, groups, d_state),
              "D": rand(heads)}
    return inputs, 3.0 * rand(batch, heads, head_dim, d_state)


def _entry_elements(heads, head_dim, state_dim, groups, fold):
    entry = heads * head_dim + groups * state_dim + heads  # x, B, dt
    return entry, entry, entry


def _log_decays(tensors, carried):
    """dt * A of the tokens [B, T, H] and of the carried buffer entries [B, cap, H] (None at the anchor)."""
    _, dt, A, *_ = tensors
    return dt * A, (None if carried is None else carried.buffer["dt"].to(dt.dtype) * A)


FAMILY = KernelFamily(
    name="mamba2",
    inputs=("x", "dt", "A", "B", "C", "D"),
    shapes={"x": "[B, T, H, P]", "dt": "[B, T, H] (after softplus and bias)", "A": "[H] (negative)",
            "B": "[B, T, G, N]", "C": "[B, T, G, N]", "D": "[H]"},
    state_layout="[B, H, P, N]",
    test_shapes={"small": dict(B=3, H=3, P=20, G=1, N=24), "grouped": dict(B=2, H=4, P=16, G=2, N=32)},
    closed_fold=False,
    decode_reference=decode_reference,
    speculative_decode_reference=speculative_decode_reference,
    chunked=chunked,
    decode_step=decode_step,
    verify=triton_step.verify_triton,
    conventional_step=triton_step.conventional_step,
    hf_state=lambda state: state.hi,
    stored_layout=lambda state: state,
    hf_layout=lambda state: state,
    random_inputs=_random_inputs,
    head_state=lambda head_dim, state_dim: (head_dim, state_dim),
    entry_elements=_entry_elements,
    replay_state=lambda tensors, state, config, layer_idx, seq_ids: prepare_inputs(
        *tensors, state, config, layer_idx, seq_ids, torch.float32).state,
    log_decays=_log_decays,
    live_state=lambda tensors, state, config: live_state(*tensors, state, config),
    fixed_step=fixed_step,
)

__all__ = ["FAMILY", "chunked", "decode_reference", "decode_step", "speculative_decode_reference"]

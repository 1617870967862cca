"""Kimi Delta Attention under ReplaySSM: step reference, chunked teacher-forced form, Triton kernels.

    decode_reference(q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32)
    chunked(..., same arguments ..., backend="torch" | "triton")
    speculative_decode_reference(..., same arguments ...)

q, k: [B, T, H, K] (L2-normalised, q scaled by K^-0.5: what transformers' KDA functions compute
before their recurrence); v: [B, T, HV, V]; g: [B, T, HV, K] per-channel log-decay (<= 0);
beta: [B, T, HV]. All return (o [B, T, HV, V], ReplayState). Stored copies are [B, HV, V, K] (the
formats' layout); `checkpoint_kv(state)` views them as the HF [B, HV, K, V]. See `_common` for
the buffer layout and the decay-skip criterion.

Layering, one way: `_common` <- `reference` <- `chunked` (torch) <- `triton`; `chunked` with its
backend choice is defined here, above both.
"""

from __future__ import annotations

import torch

from replayssm_eval.kernels.family import KernelFamily
from replayssm_eval.kernels.kda import triton as _triton
from replayssm_eval.kernels.kda._common import _prepare, checkpoint_kv, to_format_layout
from replayssm_eval.kernels.kda.chunked import _chunked_torch
from replayssm_eval.kernels.kda.reference import decode_reference, speculative_decode_reference

BACKENDS = ("torch", "triton")


def chunked(
    q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32, backend="torch"
):
    """The teacher-forced form of `decode_reference`: same arguments, same outputs and states.

    Any plan (per-sequence phases, speculative schedules), both fold modes. Returns o
    [B, T, HV, V] in compute_dtype and the ReplayState after the call, interchangeable with
    `decode_reference`'s. backend="triton" runs `kda.triton.chunked_triton` (FP32 only).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    p = _prepare(q, k, v, g, beta, initial_state, config, layer_idx=layer_idx, seq_ids=seq_ids, compute_dtype=compute_dtype)
    return _triton.chunked_triton(p) if backend == "triton" else _chunked_torch(p)


def _random_inputs(dims, tokens, gen):
    """Test inputs: dims {B, H, HV, K, V}; q, k L2-normalised (q scaled by K^-0.5), per-channel g <= 0 with
    slow and fast channels, beta in (0, 1)."""
    batch, heads, value_heads, dk, dv = (dims[d] for d in ("B", "H", "HV", "K", "V"))
    rand = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    norm = lambda t: torch.nn.functional.normalize(t, dim=-1)  # noqa: E731
    rate = 0.5 * torch.rand(value_heads, dk, generator=gen)  # per (head, channel)
    inputs = {"q": norm(rand(batch, tokens, heads, dk)) * dk ** -0.5, "k": norm(rand(batch, tokens, heads, dk)),
              "v": rand(batch, tokens, value_heads, dv),
              "g": -rate * torch.rand(batch, tokens, value_heads, dk, generator=gen),
              "beta": torch.sigmoid(rand(batch, tokens, value_heads))}
    return inputs, rand(batch, value_heads, dk, dv)


def _entry_elements(heads, head_dim, state_dim, groups, fold):
    """k [Hk, K], u [HV, V], g [HV, K]; the closed fold also keeps v [HV, V] and beta [HV] and reads them at the flush."""
    k, u, decay = groups * state_dim, heads * head_dim, heads * state_dim
    if fold == "open":
        return k + u + decay, k + u + decay, k + u + decay
    v, beta = heads * head_dim, heads
    return k + u + decay, k + v + beta + decay, k + u + decay + v + beta


def _log_decays(tensors, carried):
    """Per-channel g of the tokens [B, T, HV, K] and of the carried buffer entries [B, cap, HV, K] (None at the anchor)."""
    g = tensors[3]
    return g, (None if carried is None else carried.buffer["g"].to(g.dtype))


FAMILY = KernelFamily(
    name="kda",
    inputs=("q", "k", "v", "g", "beta"),
    shapes={"q": "[B, T, H, K] (L2-normalised, scaled by K^-0.5)", "k": "[B, T, H, K] (L2-normalised)",
            "v": "[B, T, HV, V]", "g": "[B, T, HV, K] (per-channel log decay <= 0)", "beta": "[B, T, HV]"},
    state_layout="[B, HV, K, V]",
    test_shapes={"small": dict(B=3, H=1, HV=2, K=16, V=20), "grouped": dict(B=2, H=2, HV=4, K=32, V=16)},
    hf_scans={"kimi_linear": ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention")},
    closed_fold=True,
    decode_reference=decode_reference,
    speculative_decode_reference=speculative_decode_reference,
    chunked=chunked,
    decode_step=_triton.decode_step_triton,
    verify=_triton.verify,
    conventional_step=_triton.conventional_step,
    hf_state=lambda state: checkpoint_kv(state)[0],
    stored_layout=to_format_layout,
    random_inputs=_random_inputs,
    head_state=lambda head_dim, state_dim: (state_dim, head_dim),
    entry_elements=_entry_elements,
    replay_state=lambda tensors, state, config, layer_idx, seq_ids: _prepare(
        *tensors, state, config, layer_idx=layer_idx, seq_ids=seq_ids, compute_dtype=torch.float32).state,
    log_decays=_log_decays,
)

__all__ = ["FAMILY", "checkpoint_kv", "chunked", "decode_reference", "speculative_decode_reference"]

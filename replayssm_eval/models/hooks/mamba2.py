"""Replacements for the Mamba-2 scan functions of transformers' modeling modules.

Why here: `mamba2_chunk_scan` and `mamba2_selective_state_update` are exactly the SSM recurrence
and nothing else. Everything around them (in_proj, the causal conv and its cache, the padding
mask, the gated norm, falcon_h1's mup multipliers, out_proj) stays Hugging Face's code, and the
arguments they receive are what our kernels take. The cache's `update_recurrent_state` sees only
the final state, too late to change the outputs; wrapping the whole mixer would copy its code.

- A call with no prior state (`initial_states is None`: the prompt, or a forward without cache)
  runs transformers' own torch chunk scan, FP32 throughout (x, B, C, dt, the chunk states and the
  state passing are cast to fp32; initial states too), so the state it hands the cache is the
  exact FP32 anchor state. On GPU machines with mamba_ssm installed the module binds the SSD
  kernel, which passes chunk states in the activation dtype; we call the torch function under it.
- Every later call, one token or many, goes to `ReplaySession.scan` with the carried ReplayState.
  dt is prepared as the chunk scan prepares it, in dt's dtype: dt + dt_bias, softplus, clamp to
  the mixer's time_step_limit. (HF's own one-token path skips the clamp and computes dt * B * x
  in the activation dtype; we use the chunk path's rules for every call so that where a segment
  is cut never changes a number.) The output is returned in fp32 (or the inputs' dtype if wider)
  from both replacements, as the chunk scan returns it, for the same reason.
- The FP32 reference under the chunked engine runs transformers' torch chunk scan itself from
  the session's FP32 state (`ReplaySession.scan`'s `plain`): the plain forward's own function.
- The cache's recurrent tensor keeps the anchor state; the live state is the session's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replayssm_eval.models import routing


def make_chunk_scan(original, torch_reference):
    def mamba2_chunk_scan(
        hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None, dt_softplus=False,
        dt_limit=(0.0, float("inf")), return_final_states=False, **kwargs,
    ):
        args = (hidden_states, dt, A, B, C, chunk_size)
        opts = dict(
            D=D, dt_bias=dt_bias, initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit,
            return_final_states=return_final_states, **kwargs,
        )

        def plain(state):  # HF's FP32 chunk scan of this call from `state` (the reference's fast path)
            return torch_reference(*args, **{**opts, "initial_states": state, "return_final_states": True})

        def resume(layer):
            _refuse_packed(kwargs)
            dt_ready = _prepare_dt(dt, dt_bias, dt_softplus, dt_limit)
            y = _scan(layer, hidden_states, dt_ready, A, B, C, D, initial_states, plain)
            return (y, initial_states) if return_final_states else y  # y: [B, T, H, P]

        return routing.dispatch(original, torch_reference, args, opts, initial_states is not None, resume)

    return mamba2_chunk_scan


def make_state_update(original, torch_reference):
    def mamba2_selective_state_update(
        state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **kwargs
    ):
        layer = routing.active()
        if layer is None:
            return original(state, hidden_states, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=dt_softplus, z=z, **kwargs)
        layer.routed = True
        # HF expands per-head values over head_dim (and d_state) for the fused kernel; the math is per head
        dt = _prepare_dt(dt[:, None, :, 0], dt_bias[:, 0], dt_softplus, layer.mixer.time_step_limit)  # [B, 1, H]
        y = _scan(
            layer, hidden_states[:, None], dt, A[:, 0, 0], B[:, None], C[:, None], D[:, 0], state
        )[:, 0]  # [B, H, P]
        return y if z is None else y * F.silu(z)

    return mamba2_selective_state_update


def _prepare_dt(dt, dt_bias, dt_softplus, dt_limit):
    """The chunk scan's dt rule, in dt's dtype: [B, T, H] -> [B, T, H]."""
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    return torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])


def _scan(layer, x, dt, A, B, C, D, anchor, plain=None):
    """x [B, T, H, P], dt [B, T, H], A [H], B and C [B, T, G, N], D [H] -> y [B, T, H, P] (fp32 or wider)."""
    return layer.session.scan(layer.family, layer.layer_idx, (x, dt, A, B, C, D), anchor, layer.attention_mask, plain)


def _refuse_packed(kwargs):
    if kwargs.get("seq_idx") is not None or kwargs.get("cu_seqlens") is not None:
        raise ValueError("packed sequences (seq_idx / cu_seqlens) cannot be routed: give one document per batch row")


REPLACEMENTS = {"mamba2_chunk_scan": make_chunk_scan, "mamba2_selective_state_update": make_state_update}

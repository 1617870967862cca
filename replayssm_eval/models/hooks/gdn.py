"""Replacements for the Gated DeltaNet scan functions of transformers' modeling modules.

Why here: `torch_chunk_gated_delta_rule` (prompt and multi-token calls) and
`torch_recurrent_gated_delta_rule` (one token) receive exactly the recurrence inputs our kernels
take (q, k, v, g, beta and the state) after Hugging Face's projections, conv and padding mask,
and return the output before its gated norm; everything else stays transformers' code. The
cache's `update_recurrent_state` only sees the final state, too late to change outputs.

- A call with no prior state (the prompt, or a forward without cache) runs transformers' own
  torch chunk rule, which casts q, k, v, beta, g and the initial state to fp32 before anything
  else: its final state is the exact FP32 anchor. With fla installed the module binds fla's
  chunk kernel instead; we call the torch function under it.
- Every later call goes to `ReplaySession.scan` with the carried ReplayState, after the
  preamble both torch rules share: cast to fp32, L2-normalise q and k (the same formula as the
  modeling module's `l2norm`, eps 1e-6) when asked, scale q by K^-0.5. g is the mixer's gate,
  -exp(A) softplus(.) <= 0, which the hook vouches for (`host_values.remember_nonpositive`: KDA's
  check of it then reads nothing back from the device). transformers 5.17 repeats
  q and k to the value heads before the call, 5.24 inside it; the kernels take either (value head
  hv reads key head hv // (HV / H), as repeat_interleave does).
- The FP32 reference under the chunked engine runs transformers' torch chunk rule itself from
  the session's FP32 state (`ReplaySession.scan`'s `plain`): the plain forward's own function,
  handed its inputs in fp32 (its first step casts them so), so that it returns its output in fp32
  as our kernels do: the checks of `ReplaySession`'s kernel reference compare the two before the
  query-dtype cast below, which then rounds either the same way as the rule's own final cast.
- Output in the query's dtype, as both torch rules return it. The cache's recurrent tensor keeps
  the anchor state; the live state is the session's.
"""

from __future__ import annotations

import torch

from replayssm_eval.models import routing
from replayssm_eval.models.session import at_least_fp32
from replayssm_eval.replay.host_values import remember_nonpositive


def make_chunk_rule(original, torch_reference):
    def torch_chunk_gated_delta_rule(
        query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, **kwargs,
    ):
        args = (query, key, value, g, beta)
        opts = dict(
            chunk_size=chunk_size, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs,
        )

        def plain(state):  # HF's FP32 chunk rule of this call from `state` (the reference's fast path), output fp32
            return torch_reference(*map(at_least_fp32, args), **{**opts, "initial_state": state,
                                                                 "output_final_state": True})

        return routing.dispatch(
            original, torch_reference, args, opts, initial_state is not None,
            lambda layer: _continue(layer, *args, initial_state, output_final_state, use_qk_l2norm_in_kernel, kwargs,
                                    plain),
        )

    return torch_chunk_gated_delta_rule


def make_recurrent_rule(original, torch_reference):
    def torch_recurrent_gated_delta_rule(
        query, key, value, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
        **kwargs,
    ):
        layer = routing.active()
        if layer is None:
            return original(
                query, key, value, g, beta, initial_state=initial_state, output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs,
            )
        layer.routed = True
        return _continue(layer, query, key, value, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel, kwargs)

    return torch_recurrent_gated_delta_rule


def _continue(layer, query, key, value, g, beta, anchor, output_final_state, l2norm, kwargs, plain=None):
    """q, k [B, T, H, K], v [B, T, HV, V], g and beta [B, T, HV] -> (o [B, T, HV, V], state for the cache)."""
    if kwargs.get("cu_seqlens") is not None:
        raise ValueError("packed sequences (cu_seqlens) cannot be routed: give one document per batch row")
    q, k = at_least_fp32(query), at_least_fp32(key)
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    q = q * q.shape[-1] ** -0.5
    remember_nonpositive(g)  # the mixers' gates: g = -exp(A) softplus(.), so KDA's <= 0 check needs no device read
    o = layer.session.scan(layer.family, layer.layer_idx, (q, k, value, g, beta), anchor, layer.attention_mask, plain)
    return o.to(query.dtype), (anchor if output_final_state else None)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


REPLACEMENTS = {"torch_chunk_gated_delta_rule": make_chunk_rule, "torch_recurrent_gated_delta_rule": make_recurrent_rule}

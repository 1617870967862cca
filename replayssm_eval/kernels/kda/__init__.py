"""Kimi Delta Attention under ReplaySSM: step reference, chunked teacher-forced form, Triton kernels.

    decode_reference(q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32)
    chunked(..., same arguments ..., backend="torch" | "triton")
    speculative_decode_reference(..., same arguments ...)

q, k: [B, T, H, K]; v: [B, T, HV, V]; g: [B, T, HV, K] per-channel log-decay (<= 0); beta: [B, T, HV].
All return (o [B, T, HV, V], ReplayState). Stored copies are [B, HV, V, K] (the formats' layout);
`checkpoint_kv(state)` views them as the HF [B, HV, K, V]. See `_common` for the buffer layout
and the decay-skip criterion.
"""

from replayssm_eval.kernels.kda._common import checkpoint_kv
from replayssm_eval.kernels.kda.chunked import chunked
from replayssm_eval.kernels.kda.reference import decode_reference, speculative_decode_reference

__all__ = ["checkpoint_kv", "chunked", "decode_reference", "speculative_decode_reference"]

"""Gated DeltaNet under ReplaySSM: step reference, chunked teacher-forced form, Triton kernels.

    decode_reference(q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32)
    chunked(..., same arguments ..., backend="torch" | "triton")
    speculative_decode_reference(..., same arguments ...)

q, k: [B, T, H, K]; v: [B, T, HV, V]; g (log-decay <= 0), beta: [B, T, HV]. All return
(o [B, T, HV, V], ReplayState). Stored copies are [B, HV, V, K] (the formats' layout);
`checkpoint_kv(state)` views them as the HF [B, HV, K, V]. The reference, the chunked torch form
and the host side are the delta rule's (`kernels.delta`, scalar decay); `triton_chunk` and
`triton_step` hold GDN's own kernels.
"""

from replayssm_eval.kernels.delta import DeltaRule, checkpoint_kv
from replayssm_eval.kernels.gdn import triton_chunk, triton_step

RULE = DeltaRule(per_channel=False, chunk=triton_chunk, step=triton_step)
decode_reference, speculative_decode_reference, chunked, decode_step_triton, verify = RULE.entry_points()
FAMILY = RULE.family("gdn", qk_normalised="if the layer asks")

__all__ = ["FAMILY", "checkpoint_kv", "chunked", "decode_reference", "decode_step_triton", "speculative_decode_reference",
           "verify"]

"""Kimi Delta Attention under ReplaySSM: step reference, chunked teacher-forced form, Triton kernels.

    decode_reference(q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32)
    chunked(..., same arguments ..., backend="torch" | "triton")
    speculative_decode_reference(..., same arguments ...)

q, k: [B, T, H, K] (L2-normalised, q scaled by K^-0.5: what transformers' KDA functions compute
before their recurrence); v: [B, T, HV, V]; g: [B, T, HV, K] per-channel log-decay (<= 0);
beta: [B, T, HV]. All return (o [B, T, HV, V], ReplayState). Stored copies are [B, HV, V, K] (the
formats' layout); `checkpoint_kv(state)` views them as the HF [B, HV, K, V]. KDA is Gated DeltaNet
with a per-channel decay: the reference, the chunked torch form and the host side are the delta
rule's (`kernels.delta`, per channel; `delta._common` for the buffer and the decay-skip
criterion); `triton_chunk` and `triton_step` hold KDA's own kernels.
"""

from replayssm_eval.kernels.delta import DeltaRule, checkpoint_kv
from replayssm_eval.kernels.kda import triton_chunk, triton_step

__all__ = ["FAMILY", "checkpoint_kv", "chunked", "decode_reference", "decode_step_triton", "speculative_decode_reference",
           "verify"]

RULE = DeltaRule(per_channel=True, chunk=triton_chunk, step=triton_step)
FAMILY = RULE.family("kda", qk_normalised="by the adapter")
decode_reference, speculative_decode_reference, chunked, decode_step_triton, verify = RULE.entry_points()

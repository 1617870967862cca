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
criterion); `triton` holds KDA's own kernels.
"""

from __future__ import annotations

from replayssm_eval.kernels.delta import DeltaRule
from replayssm_eval.kernels.delta._common import checkpoint_kv
from replayssm_eval.kernels.kda import triton as _triton

RULE = DeltaRule(per_channel=True, kernels=_triton)
decode_reference = RULE.decode_reference
speculative_decode_reference = RULE.speculative_decode_reference
chunked = RULE.chunked
decode_step_triton = RULE.decode_step_triton
verify = RULE.verify

FAMILY = RULE.family(
    "kda",
    shapes={"q": "[B, T, H, K] (L2-normalised, scaled by K^-0.5)", "k": "[B, T, H, K] (L2-normalised)",
            "v": "[B, T, HV, V]", "g": "[B, T, HV, K] (per-channel log decay <= 0)", "beta": "[B, T, HV]"},
    test_shapes={"small": dict(B=3, H=1, HV=2, K=16, V=20), "grouped": dict(B=2, H=2, HV=4, K=32, V=16)},
    hf_scans={"kimi_linear": ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention")},
)

__all__ = ["FAMILY", "checkpoint_kv", "chunked", "decode_reference", "decode_step_triton", "speculative_decode_reference",
           "verify"]

"""Gated DeltaNet under ReplaySSM: step reference, chunked teacher-forced form, Triton kernels.

    decode_reference(q, k, v, g, beta, initial_state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32)
    chunked(..., same arguments ..., backend="torch" | "triton")
    speculative_decode_reference(..., same arguments ...)

q, k: [B, T, H, K]; v: [B, T, HV, V]; g (log-decay <= 0), beta: [B, T, HV]. All return
(o [B, T, HV, V], ReplayState). Stored copies are [B, HV, V, K] (the formats' layout);
`checkpoint_kv(state)` views them as the HF [B, HV, K, V]. The reference, the chunked torch form
and the host side are the delta rule's (`kernels.delta`, scalar decay); `triton` holds GDN's own
kernels.
"""

from __future__ import annotations

from replayssm_eval.kernels.delta import DeltaRule
from replayssm_eval.kernels.delta._common import checkpoint_kv
from replayssm_eval.kernels.gdn import triton as _triton

RULE = DeltaRule(per_channel=False, kernels=_triton)
decode_reference = RULE.decode_reference
speculative_decode_reference = RULE.speculative_decode_reference
chunked = RULE.chunked
decode_step_triton = RULE.decode_step_triton
verify = RULE.verify

FAMILY = RULE.family(
    "gdn",
    shapes={"q": "[B, T, H, K] (L2-normalised if the layer asks, scaled by K^-0.5)", "k": "[B, T, H, K]",
            "v": "[B, T, HV, V]", "g": "[B, T, HV] (log decay <= 0)", "beta": "[B, T, HV]"},
    test_shapes={"small": dict(B=3, H=1, HV=2, K=16, V=20), "grouped": dict(B=2, H=2, HV=4, K=32, V=16)},
    hf_scans=dict.fromkeys(
        ("qwen3_5", "qwen3_5_moe", "qwen3_next", "olmo_hybrid"),
        ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
    ),
)

__all__ = ["FAMILY", "checkpoint_kv", "chunked", "decode_reference", "decode_step_triton", "speculative_decode_reference",
           "verify"]

"""Replacements for the Kimi Delta Attention scan functions of transformers' kimi_linear module.

`chunk_kimi_delta_attention` (prompt and multi-token calls) and `recurrent_kimi_delta_attention`
(one token) take the same arguments as the Gated DeltaNet torch rules, in the same order, and do
the same preamble before their recurrence: cast to fp32, L2-normalise q and k (eps 1e-6) when
`use_qk_l2norm_in_kernel` (the mixer always asks), scale q by K^-0.5. The only differences are the
per-channel log-decay g [B, T, H, K] (computed in fp32 by the mixer's forget gate) in place of
GDN's [B, T, HV], no head grouping (q, k and v all have `linear_num_heads` heads), and the
L2 norm written x / sqrt(|x|^2 + eps) rather than x * rsqrt(|x|^2 + eps) (equal to float noise).
So the GDN hooks (`hooks.gdn`, which say why these functions are the hook point) serve KDA as
they are: they hand q, k, v, g, beta in the kernels' convention to `ReplaySession.scan`, which
runs the layer's kernel family (`kernels.kda`). Conv states and the cache's recurrent tensor
(the FP32 anchor) stay transformers' code.
"""

from __future__ import annotations

from replayssm_eval.models.hooks.gdn import make_chunk_rule, make_recurrent_rule

REPLACEMENTS = {"chunk_kimi_delta_attention": make_chunk_rule, "recurrent_kimi_delta_attention": make_recurrent_rule}

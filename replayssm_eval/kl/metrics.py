"""Per-token comparison of a config's next-token distribution with the FP32 reference's.

For reference logits a, config logits b and the text's next token y, with p = softmax(a) and
q = softmax(b), all in float32 from log_softmax:

    kl          KL(p || q) = sum_v p_v (log p_v - log q_v)       the main figure
    reverse_kl  KL(q || p) = sum_v q_v (log q_v - log p_v)
    top1_agree  1.0 if argmax a == argmax b else 0.0
    nll_diff    (-log q_y) - (-log p_y)                         > 0: the config predicts the text worse
    delta_p     q_y - p_y                                       llama.cpp's Δp (--kl-divergence)

Terms with p_v = 0 (q_v = 0 for the reverse) count as 0, so -inf logits give no NaN. Identical
logits give exactly 0 (every log-ratio is 0.0). Float round-off can make a KL a tiny negative
number; it is clamped to 0 because KL is non-negative. A segment is processed in slices of
tokens, so its float32 [tokens, vocab] temporaries stay near `max_elements` elements each.
"""

from __future__ import annotations

import torch

METRICS = ("kl", "reverse_kl", "top1_agree", "nll_diff", "delta_p")
MAX_ELEMENTS = 1 << 24


def token_metrics(
    ref_logits: torch.Tensor, cfg_logits: torch.Tensor, targets: torch.Tensor, *, max_elements: int = MAX_ELEMENTS
) -> torch.Tensor:
    """Per-token metrics of one segment.

    ref_logits, cfg_logits: [B, T, V] any float dtype; targets: [B, T] int64.
    Returns [B, len(METRICS), T] float32, in METRICS order.
    """
    if ref_logits.shape != cfg_logits.shape or ref_logits.shape[:2] != targets.shape:
        raise ValueError(
            f"shapes differ: reference logits {list(ref_logits.shape)}, config logits {list(cfg_logits.shape)}, "
            f"targets {list(targets.shape)}; expected [B, T, V], [B, T, V], [B, T]"
        )
    batch, length, vocab = ref_logits.shape
    out = torch.empty(batch, len(METRICS), length, dtype=torch.float32, device=ref_logits.device)
    step = max(1, max_elements // max(1, batch * vocab))
    for t0 in range(0, length, step):
        t1 = min(length, t0 + step)
        logp = torch.log_softmax(ref_logits[:, t0:t1].float(), dim=-1)  # [B, t, V]
        logq = torch.log_softmax(cfg_logits[:, t0:t1].float(), dim=-1)  # [B, t, V]
        y = targets[:, t0:t1, None]  # [B, t, 1]
        out[:, 0, t0:t1] = _kl(logp, logq)
        out[:, 1, t0:t1] = _kl(logq, logp)
        out[:, 2, t0:t1] = (logp.argmax(-1) == logq.argmax(-1)).float()
        logp_y, logq_y = logp.gather(-1, y).squeeze(-1), logq.gather(-1, y).squeeze(-1)  # [B, t]
        out[:, 3, t0:t1] = logp_y - logq_y
        out[:, 4, t0:t1] = logq_y.exp() - logp_y.exp()
    return out


def token_nll(logits: torch.Tensor, targets: torch.Tensor, *, max_elements: int = MAX_ELEMENTS) -> torch.Tensor:
    """Negative log-likelihood of `targets` [B, T] under `logits` [B, T, V]; returns [B, T] float32."""
    batch, length, vocab = logits.shape
    out = torch.empty(batch, length, dtype=torch.float32, device=logits.device)
    step = max(1, max_elements // max(1, batch * vocab))
    for t0 in range(0, length, step):
        t1 = min(length, t0 + step)
        logp = torch.log_softmax(logits[:, t0:t1].float(), dim=-1)  # [B, t, V]
        out[:, t0:t1] = -logp.gather(-1, targets[:, t0:t1, None]).squeeze(-1)
    return out


def _kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last axis from log-probabilities; [..., V] -> [...]."""
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    return terms.sum(-1).clamp_min(0.0)

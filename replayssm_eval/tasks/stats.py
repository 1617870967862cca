"""Paired statistics of a config's accuracy against FP32 on the same questions.

Per question, FP32 and the config are each right (1) or wrong (0). The gap is acc(config) -
acc(FP32). Its 95% interval is a paired percentile bootstrap: questions are resampled with
replacement (the same draw for both, so the pairing is kept) `iters` times from a fixed seed.
McNemar's test looks only at the discordant questions: b flipped right -> wrong, c wrong -> right;
under "no difference" each discordant question is either with probability 1/2, and the p-value
is the exact two-sided binomial test of min(b, c) in b + c draws (scipy.stats.binomtest); 1 when
b + c = 0.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

CI_LEVEL = 0.95
BOOTSTRAP_ITERS = 10000
BOOTSTRAP_SEED = 0
_BLOCK = 500  # resamples drawn at once: memory [block, n]


def paired_bootstrap_ci(base, other, *, iters: int = BOOTSTRAP_ITERS, seed: int = BOOTSTRAP_SEED):
    """95% percentile interval of mean(other) - mean(base) over paired questions; (None, None) for none."""
    diff = np.asarray(other, dtype=np.float64) - np.asarray(base, dtype=np.float64)  # [n]
    if diff.size == 0:
        return None, None
    rng = np.random.default_rng(seed)
    means = np.concatenate([
        diff[rng.integers(0, diff.size, size=(min(_BLOCK, iters - done), diff.size))].mean(axis=1)
        for done in range(0, iters, _BLOCK)
    ])  # [iters]
    tail = 100 * (1 - CI_LEVEL) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def mcnemar_p(flips_to_wrong: int, flips_to_right: int) -> float:
    """Exact two-sided McNemar p-value from the two discordant counts."""
    discordant = flips_to_wrong + flips_to_right
    if discordant == 0:
        return 1.0
    return float(stats.binomtest(min(flips_to_wrong, flips_to_right), discordant, 0.5).pvalue)


def compare(base, other, *, iters: int = BOOTSTRAP_ITERS, seed: int = BOOTSTRAP_SEED) -> dict:
    """acc, gap, ci_low, ci_high, p_value, flips_to_wrong, flips_to_right of `other` against `base` (0/1 arrays [n])."""
    base, other = np.asarray(base, dtype=bool), np.asarray(other, dtype=bool)
    to_wrong, to_right = int((base & ~other).sum()), int((~base & other).sum())
    low, high = paired_bootstrap_ci(base, other, iters=iters, seed=seed)
    n = base.size
    return {
        "acc": float(other.mean()) if n else None,
        "gap": float(other.mean() - base.mean()) if n else None,
        "ci_low": low,
        "ci_high": high,
        "p_value": mcnemar_p(to_wrong, to_right),
        "flips_to_wrong": to_wrong,
        "flips_to_right": to_right,
    }

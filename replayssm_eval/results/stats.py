"""Paired statistics of a config's accuracy against FP32 on the same questions, n samples each.

Per question and sample j, FP32 and the config are each right (1) or wrong (0); sample j of a
question is drawn with the same random numbers under both (`generate.sampling`), so (question, j) pairs.
A question's score is the mean of its n samples (avg@n); accuracy is the mean over questions. The
gap is acc(config) - acc(FP32). Its 95% interval is a paired percentile bootstrap over questions
(clusters of n samples): questions are resampled with replacement (the same draw for both) `iters`
times from a fixed seed, and each resample's gap is the mean of the per-question differences.

The p-value at n = 1 is McNemar's exact test: b flipped right -> wrong, c wrong -> right; under
"no difference" each discordant question is either with probability 1/2, and the p-value is the
exact two-sided binomial test of min(b, c) in b + c draws (scipy.stats.binomtest); 1 when b + c = 0.
At n > 1 it is the exact paired sign-flip (permutation) test on the per-question differences
d_q = (correct samples of the config) - (of FP32), integers in -n..n: under "no difference" each
d_q is as likely -d_q, and p = P(|sum of +-d_q| >= |sum of d_q|) over the 2^Q sign choices,
computed exactly by convolving the per-magnitude binomial distributions. At n = 1 it is McNemar's
test (`sign_flip_p` of b values -1 and c values +1 equals `mcnemar_p(b, c)`).
"""

from __future__ import annotations

import numpy as np
from scipy import signal, stats

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


def sign_flip_p(diffs) -> float:
    """Exact two-sided paired sign-flip p-value of integer per-question differences [Q] (1 when all are 0)."""
    diffs = np.asarray(diffs, dtype=np.int64)
    sizes = np.abs(diffs[diffs != 0])
    if sizes.size == 0:
        return 1.0
    total = int(sizes.sum())
    dist = np.ones(1)  # P(S = s) for s = -span..span, span growing with each magnitude
    for m, count in zip(*np.unique(sizes, return_counts=True)):
        part = np.zeros(2 * int(m) * int(count) + 1)  # m (2X - count), X ~ Bin(count, 1/2), on the grid -m count..m count
        part[:: 2 * int(m)] = stats.binom.pmf(np.arange(count + 1), count, 0.5)
        dist = np.convolve(dist, part) if dist.size * part.size < 10**7 else np.clip(signal.fftconvolve(dist, part), 0, None)
    values = np.arange(-total, total + 1)  # [2 total + 1]
    return float(min(1.0, dist[np.abs(values) >= abs(int(diffs.sum()))].sum()))


def compare(base, other, *, iters: int = BOOTSTRAP_ITERS, seed: int = BOOTSTRAP_SEED) -> dict:
    """acc, gap, ci_low, ci_high, p_value, flips_to_wrong, flips_to_right of `other` against `base`.

    base, other: 0/1 arrays [Q] (one sample per question) or [Q, n] (sample j of both drawn alike);
    flips count (question, sample) pairs; the interval and the p-value treat questions as the units.
    """
    base, other = np.asarray(base, dtype=bool), np.asarray(other, dtype=bool)
    if base.ndim == 1:
        base, other = base[:, None], other[:, None]
    to_wrong, to_right = int((base & ~other).sum()), int((~base & other).sum())
    low, high = paired_bootstrap_ci(base.mean(1), other.mean(1), iters=iters, seed=seed)
    questions, samples = base.shape
    p_value = (mcnemar_p(to_wrong, to_right) if samples == 1
               else sign_flip_p(other.sum(1, dtype=np.int64) - base.sum(1, dtype=np.int64)))
    return {
        "acc": float(other.mean()) if questions else None,
        "gap": float(other.mean() - base.mean()) if questions else None,
        "ci_low": low,
        "ci_high": high,
        "p_value": p_value,
        "flips_to_wrong": to_wrong,
        "flips_to_right": to_right,
    }

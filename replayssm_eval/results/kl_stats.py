"""llama.cpp's `--kl-divergence` statistics of per-token values (its tools/perplexity/perplexity.cpp).

For n tokens with per-token KL k_i, Δp_i and top-1 agreement a_i (1 or 0):

    mean ± se       mean of x; se = sqrt((mean(x^2) - mean(x)^2) / (n - 1)), i.e. std(ddof=1) / sqrt(n)
    percentile f    linear interpolation at index f (n - 1) of the sorted values (numpy's default); the
                    median is the 50th percentile
    Δp              p_config(y) - p_reference(y), y the text's next token (> 0: the config gives it more
                    probability); in probability units, llama.cpp prints it in %
    RMS Δp ± se     sqrt(mean(Δp^2)); se = se(Δp^2) / (2 RMS), the first-order propagation of mean(Δp^2)'s se
    same top p      100 mean(a) in %, se = 100 sqrt(p (1 - p) / (n - 1))

Unlike llama.cpp, an se of fewer than 11 tokens is still given (it prints 0); with one token it is null.
"""

from __future__ import annotations

import math

import numpy as np

# (field suffix, fraction); the median and p99 keep the names kl.json had before the others
KL_PERCENTILES = (("p99_9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.90), ("median", 0.5), ("p10", 0.10),
                  ("p5", 0.05), ("p1", 0.01), ("p0_1", 0.001))
DELTA_P_PERCENTILES = (("p99_9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.90), ("p75", 0.75), ("median", 0.5),
                       ("p25", 0.25), ("p10", 0.10), ("p5", 0.05), ("p1", 0.01), ("p0_1", 0.001))


def token_statistics(kl: np.ndarray, top1: np.ndarray, delta_p: np.ndarray) -> dict:
    """llama.cpp's statistics (module docstring) of same-shape arrays of per-token KL, top-1 agreement and Δp."""
    kl, delta_p = np.asarray(kl, np.float64).ravel(), np.asarray(delta_p, np.float64).ravel()
    same = float(np.mean(top1, dtype=np.float64))
    mse, mse_se = _mean_se(delta_p**2)
    rms = math.sqrt(mse)
    out = {"kl_se": _mean_se(kl)[1], "kl_max": float(kl.max()), "kl_min": float(kl.min())}
    out |= _percentiles("kl", kl, KL_PERCENTILES)
    mean, se = _mean_se(delta_p)
    out |= {"delta_p_mean": mean, "delta_p_se": se, "delta_p_max": float(delta_p.max()),
            "delta_p_min": float(delta_p.min())}
    out |= _percentiles("delta_p", delta_p, DELTA_P_PERCENTILES)
    out |= {"delta_p_rms": rms, "delta_p_rms_se": None if mse_se is None or rms == 0 else mse_se / (2 * rms),
            "same_top_p_pct": 100 * same,
            "same_top_p_se_pct": None if kl.size < 2 else 100 * math.sqrt(same * (1 - same) / (kl.size - 1))}
    return out


def _mean_se(x: np.ndarray) -> tuple[float, float | None]:
    """Mean of x [n] and its standard error std(ddof=1) / sqrt(n); None for n < 2."""
    return float(x.mean()), None if x.size < 2 else float(x.std(ddof=1) / math.sqrt(x.size))


def _percentiles(prefix: str, x: np.ndarray, fractions) -> dict:
    values = np.percentile(x, [100 * f for _, f in fractions])
    return {f"{prefix}_{name}": float(v) for (name, _), v in zip(fractions, values)}

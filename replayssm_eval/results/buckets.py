"""Length buckets: of generated length for the KL (with the statistics reported per bucket), and of the
FP32 run's generation length for downstream accuracy.

KL. Generated length n = 1..tokens counts the generated token being predicted: n = 1 is predicted by
the prefill's last logits, n = k by the decode step that consumed generated token k-1. A bucket
covers start <= n <= end (both inclusive). Bucket specs (`--buckets`):

    pow2        starts 1, 2, 4, ... below `tokens`; the last bucket ends at `tokens` (default)
    log:N       N starts spaced geometrically over [1, tokens] (fewer when rounding merges some)
    1,64,1024   explicit starts, strictly increasing, within [1, tokens]; the first start may be > 1

Per bucket and config: count (tokens over all documents), the means of the per-token metrics over all
tokens of all documents, llama.cpp's statistics of the KL, Δp and top-1 agreement (`kl_stats`: standard
errors over tokens, max, min, percentiles by linear interpolation), and a 95% confidence interval of
the mean KL.

The interval is a Student t-interval over per-document bucket means: consecutive tokens of one
document are strongly autocorrelated (they share the carried state), so documents, not tokens,
are the independent samples; a run has few documents (4-16), for which a percentile bootstrap
over documents is too narrow (it lacks the t quantile's small-sample widening and has few
distinct resamples), while the t-interval is exact under normal document means and needs no
random draws. The lower bound is clipped at 0 (KL >= 0). With one document there is no interval
(null).

Accuracy. A question's length is `gen_tokens` of its FP32 generation (tokens generated until the stop,
1..max_gen_toks); every config is then read inside the same buckets, on the same questions. A
bucket covers lengths start..end, both inclusive (`Bucket`); the first starts at 1 and
the last ends at max_gen_toks, so every question falls in exactly one. Specs (`--buckets`):

    quantile:K   K buckets with about equal numbers of questions (default quantile:4): bucket
                 i = 0..K-1 starts at the length of the (ceil(i n / K) + 1)-th shortest question
                 (bucket 0 at 1); buckets whose starts coincide (ties) merge, so there may be fewer
    1,512,2048   fixed starts, strictly increasing within [1, max_gen_toks], the first one 1
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from replayssm_eval.results.kl_stats import token_statistics

CI_LEVEL = 0.95
DEFAULT_BUCKETS = "quantile:4"  # accuracy's --buckets


@dataclass(frozen=True)
class Bucket:
    """Generated lengths start..end, both inclusive, 1-based."""

    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start + 1


def parse_buckets(spec: str, tokens: int) -> list[Bucket]:
    """Buckets for generated lengths 1..`tokens` from a spec (see the module docstring)."""
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    spec = spec.strip()
    if spec == "pow2":
        starts = [1] + [2**k for k in range(1, tokens.bit_length()) if 2**k < tokens]
    elif spec.startswith("log:"):
        try:
            count = int(spec[4:])
        except ValueError:
            count = 0
        if count < 1:
            raise ValueError(f"bad bucket spec {spec!r}: log:N needs an integer N >= 1, e.g. log:12")
        starts = sorted({int(s) for s in np.floor(np.geomspace(1, tokens + 1, count + 1)[:-1])})
    else:
        try:
            starts = [int(s) for s in spec.split(",")]
        except ValueError:
            raise ValueError(
                f"bad bucket spec {spec!r}; expected pow2, log:N, or increasing starts such as 1,64,1024"
            ) from None
        if any(b <= a for a, b in zip(starts, starts[1:])) or starts[0] < 1 or starts[-1] > tokens:
            raise ValueError(f"bucket starts {spec!r} must be strictly increasing within [1, {tokens}] (--tokens)")
    ends = [s - 1 for s in starts[1:]] + [tokens]
    return [Bucket(s, e) for s, e in zip(starts, ends)]


def bucket_stats(kl, reverse_kl, top1, nll_diff, delta_p, bucket: Bucket) -> dict:
    """Statistics of one bucket; each input is a [D, tokens] float32 array (column n-1: generated length n)."""
    cols = slice(bucket.start - 1, bucket.end)
    values = kl[:, cols]  # [D, size]
    doc_means = values.mean(axis=1, dtype=np.float64)  # [D]
    low, high = mean_interval(doc_means)
    llama = token_statistics(values, top1[:, cols], delta_p[:, cols])
    return {
        "start": bucket.start,
        "end": bucket.end,
        "count": int(values.size),
        "kl_mean": float(values.mean(dtype=np.float64)),
        "kl_median": llama.pop("kl_median"),
        "kl_p99": llama.pop("kl_p99"),
        "kl_ci_low": low,
        "kl_ci_high": high,
        "top1_agree": float(top1[:, cols].mean(dtype=np.float64)),
        "reverse_kl_mean": float(reverse_kl[:, cols].mean(dtype=np.float64)),
        "nll_diff_mean": float(nll_diff[:, cols].mean(dtype=np.float64)),
        **llama,
    }


def mean_interval(doc_means: np.ndarray) -> tuple[float | None, float | None]:
    """95% t-interval of the mean of per-document means, lower bound clipped at 0; (None, None) for one document."""
    n = len(doc_means)
    if n < 2:
        return None, None
    mean = float(doc_means.mean())
    half = float(stats.t.ppf(0.5 + CI_LEVEL / 2, n - 1) * doc_means.std(ddof=1) / np.sqrt(n))
    return max(0.0, mean - half), mean + half


def parse_spec(spec: str) -> tuple[str, int | tuple[int, ...]]:
    """("quantile", K) or ("starts", (1, ...)); errors name the spec and the accepted forms."""
    accepted = "quantile:K (K >= 1, e.g. quantile:4) or fixed starts such as 1,512,2048"
    spec = spec.strip()
    try:
        if spec.startswith("quantile:"):
            count = int(spec[len("quantile:"):])
            if count < 1:
                raise ValueError
            return "quantile", count
        starts = tuple(int(s) for s in spec.split(","))
    except ValueError:
        raise ValueError(f"bad bucket spec {spec!r}; accepted: {accepted}") from None
    if starts[0] != 1 or any(b <= a for a, b in zip(starts, starts[1:])):
        raise ValueError(f"bucket starts {spec!r} must begin with 1 and increase strictly; accepted: {accepted}")
    return "starts", starts


def make_buckets(spec: str, lengths, max_gen_toks: int) -> list[Bucket]:
    """Buckets covering 1..max_gen_toks from the FP32 lengths [n] (see the module docstring)."""
    kind, value = parse_spec(spec)
    if kind == "quantile":
        ordered = np.sort(np.asarray(lengths, dtype=np.int64))
        n = len(ordered)
        firsts = sorted({int(ordered[math.ceil(i * n / value)]) for i in range(value) if math.ceil(i * n / value) < n})
        starts = [1, *firsts[1:]]  # the first bucket reaches down to length 1
    else:
        starts = list(value)
        if starts[-1] > max_gen_toks:
            raise ValueError(f"bucket start {starts[-1]} is beyond max_gen_toks {max_gen_toks}")
    ends = [s - 1 for s in starts[1:]] + [max_gen_toks]
    return [Bucket(s, e) for s, e in zip(starts, ends)]


def bucket_index(buckets: list[Bucket], lengths) -> np.ndarray:
    """[n] index of the bucket holding each length."""
    starts = np.array([b.start for b in buckets])
    return np.searchsorted(starts, np.asarray(lengths), side="right") - 1

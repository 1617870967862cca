"""Length buckets for downstream accuracy, defined by the FP32 run's generation lengths.

A question's length is `gen_tokens` of its FP32 generation (tokens generated until the stop,
1..max_gen_toks); every config is then read inside the same buckets, on the same questions. A
bucket covers lengths start..end, both inclusive (`kl.buckets.Bucket`); the first starts at 1 and
the last ends at max_gen_toks, so every question falls in exactly one. Specs (`--buckets`):

    quantile:K   K buckets with about equal numbers of questions (default quantile:4): bucket
                 i = 0..K-1 starts at the length of the (ceil(i n / K) + 1)-th shortest question
                 (bucket 0 at 1); buckets whose starts coincide (ties) merge, so there may be fewer
    1,512,2048   fixed starts, strictly increasing within [1, max_gen_toks], the first one 1
"""

from __future__ import annotations

import math

import numpy as np

from replayssm_eval.kl.buckets import Bucket

DEFAULT_BUCKETS = "quantile:4"


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

"""Bucket and statistics functions against hand computations and scipy."""

import math

import numpy as np
import pytest
from scipy import stats

from replayssm_eval.kl.buckets import Bucket
from replayssm_eval.tasks.buckets import bucket_index, make_buckets, parse_spec
from replayssm_eval.tasks.stats import compare, mcnemar_p, paired_bootstrap_ci


def test_quantile_buckets_by_hand():
    lengths = [5, 1, 3, 8, 2, 7, 4, 6]  # sorted 1..8: quarters start at the 1st, 3rd, 5th, 7th shortest
    buckets = make_buckets("quantile:4", lengths, 100)
    assert buckets == [Bucket(1, 2), Bucket(3, 4), Bucket(5, 6), Bucket(7, 100)]
    assert bucket_index(buckets, lengths).tolist() == [2, 0, 1, 3, 0, 3, 1, 2]


def test_quantile_ties_merge_and_the_first_bucket_reaches_down_to_one():
    assert make_buckets("quantile:4", [16] * 5, 16) == [Bucket(1, 16)]
    assert make_buckets("quantile:2", [10, 10, 10, 40], 64) == [Bucket(1, 64)]  # the median is a tie too
    assert make_buckets("quantile:2", [10, 20, 30, 40], 64) == [Bucket(1, 29), Bucket(30, 64)]
    assert make_buckets("quantile:1", [7, 9], 64) == [Bucket(1, 64)]


def test_fixed_starts_and_bad_specs():
    assert make_buckets("1,512,2048", [3], 4096) == [Bucket(1, 511), Bucket(512, 2047), Bucket(2048, 4096)]
    assert bucket_index(make_buckets("1,10", [], 20), [1, 9, 10, 20]).tolist() == [0, 0, 1, 1]
    for bad in ("quantile:0", "quantile:x", "2,10", "1,10,10", "pow2"):
        with pytest.raises(ValueError, match="accepted: quantile:K"):
            parse_spec(bad)
    with pytest.raises(ValueError, match="beyond max_gen_toks"):
        make_buckets("1,512", [3], 256)


def test_mcnemar_is_the_exact_binomial_test_on_discordant_pairs():
    assert mcnemar_p(3, 0) == pytest.approx(2 * 0.5**3)
    assert mcnemar_p(5, 2) == pytest.approx(2 * (1 + 7 + 21) / 2**7)
    assert mcnemar_p(0, 0) == 1.0
    for b, c in ((4, 11), (30, 17), (1, 1)):
        assert mcnemar_p(b, c) == pytest.approx(stats.binomtest(min(b, c), b + c, 0.5).pvalue)


def test_compare_counts_flips_and_gap_by_hand():
    fp32 = [1, 1, 1, 0, 0, 1, 0, 1]
    other = [1, 0, 0, 0, 1, 1, 0, 0]
    out = compare(fp32, other, iters=2000)
    assert (out["flips_to_wrong"], out["flips_to_right"]) == (3, 1)
    assert out["acc"] == pytest.approx(3 / 8) and out["gap"] == pytest.approx(3 / 8 - 5 / 8)
    assert out["p_value"] == pytest.approx(mcnemar_p(3, 1))
    assert out["ci_low"] <= out["gap"] <= out["ci_high"]


def test_paired_bootstrap_ci():
    assert paired_bootstrap_ci([1, 0, 1], [1, 0, 1]) == (0.0, 0.0)  # identical answers: no uncertainty
    assert paired_bootstrap_ci([1, 1], [0, 0]) == (-1.0, -1.0)
    assert paired_bootstrap_ci([], []) == (None, None)
    rng = np.random.default_rng(1)
    base = rng.random(400) < 0.6
    other = np.where(rng.random(400) < 0.15, ~base, base)  # 15% of the answers flip
    low, high = paired_bootstrap_ci(base, other, iters=4000, seed=3)
    assert (low, high) == paired_bootstrap_ci(base, other, iters=4000, seed=3)  # seeded: reproducible
    diff = other.astype(float) - base
    half = 1.96 * diff.std() / math.sqrt(diff.size)  # the normal approximation of the same interval
    assert low == pytest.approx(diff.mean() - half, abs=0.2 * half)
    assert high == pytest.approx(diff.mean() + half, abs=0.2 * half)

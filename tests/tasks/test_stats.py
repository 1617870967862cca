"""Bucket and statistics functions against hand computations and scipy; avg@n over n samples per question."""

import math

import numpy as np
import pytest
from scipy import stats

from replayssm_eval.accuracy import TASKS
from replayssm_eval.results.accuracy_tables import task_report
from replayssm_eval.results.buckets import Bucket, bucket_index, make_buckets, parse_spec
from replayssm_eval.results.stats import compare, mcnemar_p, paired_bootstrap_ci, sign_flip_p


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


def test_avg_at_n_by_hand():
    fp32 = [[0, 0], [0, 0], [0, 1], [1, 1], [1, 0]]  # 5 questions, 2 samples each
    other = [[1, 1], [1, 1], [1, 1], [1, 1], [0, 0]]
    out = compare(fp32, other, iters=2000)
    assert out["acc"] == pytest.approx(0.8) and out["gap"] == pytest.approx(0.8 - 0.4)  # means of question means
    assert (out["flips_to_wrong"], out["flips_to_right"]) == (1, 5)  # (question, sample) pairs
    # correct-count differences per question 2, 2, 1, 0, -1 (sum 4); of the 16 sign choices of 2, 2, 1, 1,
    # |sum| >= 4 for +-(2+2+1+1), +-(2+2+1-1), +-(2+2-1+1): 6
    assert out["p_value"] == pytest.approx(6 / 16)
    # the interval resamples questions, each the mean of its samples: the n = 1 bootstrap of question means
    means = np.mean(fp32, 1), np.mean(other, 1)
    assert (out["ci_low"], out["ci_high"]) == paired_bootstrap_ci(*means, iters=2000)
    assert (out["ci_low"], out["ci_high"]) != paired_bootstrap_ci(np.ravel(fp32), np.ravel(other), iters=2000)


def test_sign_flip_test_is_mcnemar_at_one_sample_and_exact_beyond():
    for b, c in ((3, 0), (5, 2), (4, 11), (30, 17), (1, 1), (0, 0), (120, 151)):
        assert sign_flip_p([-1] * b + [1] * c + [0] * 7) == pytest.approx(mcnemar_p(b, c), rel=1e-9)
    rng = np.random.default_rng(2)
    diffs = rng.integers(-3, 4, size=11)
    sums = np.array([np.dot(signs, diffs) for signs in np.array(np.meshgrid(*[[-1, 1]] * 11)).reshape(11, -1).T])
    assert sign_flip_p(diffs) == pytest.approx(np.mean(np.abs(sums) >= abs(diffs.sum())), rel=1e-9)  # all 2^11 choices
    assert sign_flip_p([0, 0]) == 1.0 and sign_flip_p([2, -1]) == 1.0 and sign_flip_p([3, 1]) == pytest.approx(0.5)


def test_one_sample_per_question_gives_todays_numbers():
    rng = np.random.default_rng(4)
    base = rng.random(60) < 0.6
    other = np.where(rng.random(60) < 0.2, ~base, base)
    out = compare(base[:, None], other[:, None], iters=500)
    assert out == compare(base, other, iters=500)
    assert (out["ci_low"], out["ci_high"]) == paired_bootstrap_ci(base, other, iters=500)  # the 0/1 bootstrap of n = 1
    assert out["p_value"] == mcnemar_p(out["flips_to_wrong"], out["flips_to_right"])
    assert out["gap"] == pytest.approx(other.mean() - base.mean()) and out["flips_to_wrong"] == int((base & ~other).sum())


def test_sampled_questions_are_bucketed_by_their_mean_fp32_length():
    def samples(rows):  # doc_id -> [(correct, gen_tokens, hit_max_gen_toks, max_gen_toks, loop) per sample]
        return {doc: [(c, g, g == 8, 8, False) for c, g in pairs] for doc, pairs in rows.items()}

    fp32 = samples({0: [(1, 3), (1, 4)], 1: [(0, 1), (1, 2)], 2: [(0, 8), (0, 7)], 3: [(1, 2), (0, 2)]})
    other = samples({0: [(1, 3), (0, 5)], 1: [(0, 1), (1, 2)], 2: [(1, 8), (0, 8)], 3: [(1, 2), (1, 2)]})
    out = task_report(TASKS["gpqa_diamond"], fp32, {"x": other}, "1,4", iters=200)
    assert out["samples"] == 2 and out["n"] == 4
    first, second = out["buckets"]  # question lengths 3.5 -> 4, 1.5 -> 2, 7.5 -> 8, 2
    assert (first["start"], first["end"], first["n"], second["n"]) == (1, 3, 2, 2)
    assert first["fp32_acc"] == pytest.approx(0.5) and second["fp32_acc"] == pytest.approx(0.5)
    assert second["configs"]["x"]["acc"] == pytest.approx(0.5) and first["configs"]["x"]["acc"] == pytest.approx(0.75)
    assert second["fp32_truncated"] == pytest.approx(0.25) and second["configs"]["x"]["truncated"] == pytest.approx(0.5)
    assert second["fp32_mean_gen_tokens"] == pytest.approx((3 + 4 + 8 + 7) / 4)
    assert out["all"]["configs"]["x"]["flips_to_wrong"] == 1 and out["all"]["configs"]["x"]["flips_to_right"] == 2

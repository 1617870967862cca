"""Bucket specs, and per-bucket statistics against pandas and scipy on random data."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from replayssm_eval.results.buckets import Bucket, bucket_stats, parse_buckets


def _spans(buckets):
    return [(b.start, b.end) for b in buckets]


def test_pow2_buckets():
    assert _spans(parse_buckets("pow2", 256)) == [
        (1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 127), (128, 256)
    ]
    assert _spans(parse_buckets("pow2", 300))[-2:] == [(128, 255), (256, 300)]
    assert _spans(parse_buckets("pow2", 1)) == [(1, 1)]
    assert _spans(parse_buckets("pow2", 131072))[-1] == (65536, 131072)


@pytest.mark.parametrize("tokens", [1, 7, 100, 131072])
def test_log_buckets_cover_every_length_once(tokens):
    buckets = parse_buckets("log:10", tokens)
    assert buckets[0].start == 1 and buckets[-1].end == tokens
    assert all(b.start == a.end + 1 for a, b in zip(buckets, buckets[1:]))
    assert len(buckets) <= 10


def test_explicit_buckets():
    assert _spans(parse_buckets("1,10,100", 500)) == [(1, 9), (10, 99), (100, 500)]
    assert _spans(parse_buckets("64, 128", 200)) == [(64, 127), (128, 200)]  # lengths before 64 are left out


@pytest.mark.parametrize("spec", ["log:0", "log:x", "pow3", "1,1,4", "4,2", "0,5", "1,600"])
def test_bad_specs_name_what_is_accepted(spec):
    with pytest.raises(ValueError, match="bucket"):
        parse_buckets(spec, 500)


def test_bucket_stats_match_pandas():
    rng = np.random.default_rng(0)
    docs, tokens = 5, 203
    kl = rng.lognormal(-6, 2, size=(docs, tokens)).astype(np.float32)
    reverse = rng.lognormal(-6, 2, size=(docs, tokens)).astype(np.float32)
    top1 = (rng.random((docs, tokens)) < 0.9).astype(np.float32)
    nll = rng.normal(0, 0.1, size=(docs, tokens)).astype(np.float32)
    frame = pd.DataFrame({
        "doc": np.repeat(np.arange(docs), tokens), "n": np.tile(np.arange(1, tokens + 1), docs),
        "kl": kl.ravel(), "reverse": reverse.ravel(), "top1": top1.ravel(), "nll": nll.ravel(),
    })
    for bucket in parse_buckets("pow2", tokens):
        got = bucket_stats(kl, reverse, top1, nll, nll, bucket)
        part = frame[(frame.n >= bucket.start) & (frame.n <= bucket.end)]
        assert got["count"] == len(part)
        assert got["kl_mean"] == pytest.approx(part.kl.astype(np.float64).mean(), rel=1e-12)
        assert got["kl_median"] == pytest.approx(part.kl.median(), rel=1e-6)
        assert got["kl_p99"] == pytest.approx(part.kl.quantile(0.99), rel=1e-6)
        assert got["top1_agree"] == pytest.approx(part.top1.mean(), rel=1e-12)
        assert got["reverse_kl_mean"] == pytest.approx(part.reverse.astype(np.float64).mean(), rel=1e-12)
        assert got["nll_diff_mean"] == pytest.approx(part.nll.astype(np.float64).mean(), rel=1e-9, abs=1e-12)
        doc_means = part.groupby("doc").kl.apply(lambda s: s.astype(np.float64).mean())
        low, high = stats.t.interval(0.95, docs - 1, loc=doc_means.mean(), scale=stats.sem(doc_means))
        assert got["kl_ci_low"] == pytest.approx(max(low, 0.0), abs=1e-12)
        assert got["kl_ci_high"] == pytest.approx(high, rel=1e-9)


def test_one_document_has_no_interval():
    values = np.ones((1, 8), dtype=np.float32)
    got = bucket_stats(values, values, values, values, values, Bucket(1, 8))
    assert got["kl_ci_low"] is None and got["kl_ci_high"] is None and got["count"] == 8

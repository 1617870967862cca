"""llama.cpp's --kl-divergence statistics on hand-made tokens, against its formulas written out by hand; the
per-token Δp they need, and stores written before it was a metric."""

import math

import numpy as np
import pytest
import torch

from replayssm_eval.kl.metrics import token_metrics
from replayssm_eval.results.kl_stats import token_statistics

KL = np.array([[0.0, 1.0], [2.0, 3.0]])  # [D, N]: 4 tokens, sorted 0, 1, 2, 3
DELTA_P = np.array([[-0.5, 0.25], [0.0, 0.25]])
TOP1 = np.array([[1.0, 0.0], [1.0, 1.0]])


def test_hand_made_statistics_follow_llama_cpp():
    got = token_statistics(KL, TOP1, DELTA_P)
    # mean ± sqrt((sum x^2 / n - mean^2) / (n - 1)): KL mean 1.5, sum x^2 = 14
    assert got["kl_se"] == pytest.approx(math.sqrt((14 / 4 - 1.5**2) / 3), abs=1e-12)
    assert (got["kl_max"], got["kl_min"]) == (3.0, 0.0)
    # percentile f: sorted[i] + frac (sorted[i + 1] - sorted[i]) at f (n - 1) = 3 f, so f x 3 on 0, 1, 2, 3
    for name, f in [("p99_9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.9), ("median", 0.5), ("p10", 0.1),
                    ("p5", 0.05), ("p1", 0.01), ("p0_1", 0.001)]:
        assert got[f"kl_{name}"] == pytest.approx(3 * f, abs=1e-12), name
    # Δp: mean 0, sum Δp^2 = 0.375, sum Δp^4 = 0.0703125
    assert got["delta_p_mean"] == 0.0
    assert got["delta_p_se"] == pytest.approx(math.sqrt((0.375 / 4) / 3), abs=1e-12)
    assert (got["delta_p_max"], got["delta_p_min"]) == (0.25, -0.5)
    # sorted -0.5, 0, 0.25, 0.25: index 3 f, e.g. p75 at 2.25 -> 0.25, p25 at 0.75 -> -0.125, p10 at 0.3 -> -0.35
    assert got["delta_p_p75"] == pytest.approx(0.25, abs=1e-12)
    assert got["delta_p_median"] == pytest.approx(0.125, abs=1e-12)
    assert got["delta_p_p25"] == pytest.approx(-0.125, abs=1e-12)
    assert got["delta_p_p10"] == pytest.approx(-0.35, abs=1e-12)
    assert got["delta_p_p0_1"] == pytest.approx(-0.5 + 0.003 * 0.5, abs=1e-12)
    assert got["delta_p_p99_9"] == pytest.approx(0.25, abs=1e-12)
    # RMS sqrt(sum Δp^2 / n), its error 0.5 / RMS x sqrt((sum Δp^4 / n - (sum Δp^2 / n)^2) / (n - 1))
    rms = math.sqrt(0.375 / 4)
    assert got["delta_p_rms"] == pytest.approx(rms, abs=1e-12)
    assert got["delta_p_rms_se"] == pytest.approx(0.5 / rms * math.sqrt((0.0703125 / 4 - (0.375 / 4) ** 2) / 3),
                                                  abs=1e-12)
    # same top p: 3 of 4, error sqrt(p (1 - p) / (n - 1)), both in %
    assert got["same_top_p_pct"] == 75.0
    assert got["same_top_p_se_pct"] == pytest.approx(100 * math.sqrt(0.75 * 0.25 / 3), abs=1e-12)


def test_one_token_has_no_standard_errors():
    got = token_statistics(np.array([0.5]), np.array([1.0]), np.array([0.125]))
    assert got["kl_se"] is None and got["delta_p_se"] is None and got["delta_p_rms_se"] is None
    assert got["same_top_p_se_pct"] is None and got["kl_p99_9"] == 0.5 and got["delta_p_rms"] == 0.125


def test_delta_p_is_the_change_in_the_text_tokens_probability():
    # p = (1/2, 1/4, 1/4), q = (1/4, 1/2, 1/4): logits are log-probabilities
    ref = torch.tensor([[0.5, 0.25, 0.25]] * 3).log()[None]  # [1, 3, V]
    cfg = torch.tensor([[0.25, 0.5, 0.25]] * 3).log()[None]
    out = token_metrics(ref, cfg, torch.tensor([[0, 1, 2]]))[0]  # [metrics, T]
    torch.testing.assert_close(out[4], torch.tensor([-0.25, 0.25, 0.0]), rtol=0, atol=1e-7)
    torch.testing.assert_close(out[2], torch.zeros(3), rtol=0, atol=0)  # argmax 0 against 1


def test_a_document_stored_with_four_metrics_is_refused(tmp_path):
    from replayssm_eval.results.kl_store import load_documents, save_document

    old = np.zeros((2, 4, 6), np.float32)  # [C, 4, N]: stored before delta_p was a metric
    save_document(tmp_path, 0, old, np.zeros(6, np.float32), ["fp32", "bf16"])
    save_document(tmp_path, 1, np.zeros((2, 5, 6), np.float32), np.zeros(6, np.float32), ["fp32", "bf16"])
    with pytest.raises(ValueError, match="with 4 metrics of 6 tokens, but the run has .* with 5 metrics of 6 tokens"):
        load_documents(tmp_path, [0], ["fp32", "bf16"], 6, 5)
    assert list(load_documents(tmp_path, [1], ["fp32", "bf16"], 6, 5)) == [1]

"""The KL driver on the real bundled tiny models (CPU): the CLI end to end, the token-by-token slow path, Ctrl-C."""

import dataclasses
import functools
import json
import os
import signal

import numpy as np
import pytest
import torch

from replayssm_eval.cli import main
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kl import output
from replayssm_eval.kl import runner as runner_module
from replayssm_eval.kl.driver import evaluate_batch, run_kl
from replayssm_eval.kl.metrics import token_metrics
from replayssm_eval.kl.options import KLConfig
from replayssm_eval.models import token_by_token_logits

MODEL = "tiny-nemotron-h"
VOLATILE = ("date", "command", "options", "git")  # differ between two runs of the same numbers


@pytest.mark.slow
def test_cli_end_to_end(tmp_path):
    out = tmp_path / "run"
    code = main(["kl", "--model", MODEL, "--tokens", "128", "--prompt-len", "64", "--num-docs", "2",
                 "--config", "fp32", "--config", "fp32/fp32@16", "--config", "nvfp4/fp16sr@16",
                 "--config", "shared:nvfp4", "--segment-len", "64", "--device", "cpu", "--output", str(out)])
    assert code == 0
    report = json.loads((out / "kl.json").read_text())
    assert report["reference"]["scan"] == report["resolved"]["reference_scan"] == "hf"  # auto on the torch backend
    assert report["reference"]["scan_checks"] == {}
    configs = {c["name"]: c for c in report["configs"]}
    assert configs["fp32"]["kl_mean"] == 0.0 and all(b["kl_p99"] == 0.0 for b in configs["fp32"]["buckets"])
    # window 16 with an FP32 state against HF's plain FP32 scan: logits differ by FP32 summation order (~1e-6
    # relative), which a float32 KL (clamped at 0) turns into ~1e-8
    assert configs["fp32/fp32"]["kl_mean"] < 1e-7
    assert configs["fp32/fp32"]["kl_mean"] < 1e-3 * configs["nvfp4/fp16sr"]["kl_mean"]
    assert configs["nvfp4/fp16sr"]["kl_mean"] > 0
    assert configs["shared:nvfp4"]["kl_mean"] > configs["nvfp4/fp16sr"]["kl_mean"]
    traffic = configs["nvfp4/fp16sr"]["state_traffic"]
    assert traffic["config"] == "nvfp4/fp16sr" and traffic["per_model"]["ratio"] > 1
    assert (out / "kl_vs_length.png").stat().st_size > 0


def test_reference_through_the_kernels(tmp_path):
    """--reference-scan kernels: the reference's segments run our FP32 kernels, each SSM layer checked against HF's
    scan on the run's first segment (the differences are FP32 noise, recorded in kl.json)."""
    out = tmp_path / "run"
    code = main(["kl", "--model", MODEL, "--tokens", "40", "--prompt-len", "16", "--num-docs", "1",
                 "--config", "fp32", "--config", "nvfp4/fp16sr@8", "--segment-len", "16", "--device", "cpu",
                 "--reference-scan", "kernels", "--output", str(out)])
    assert code == 0
    report = json.loads((out / "kl.json").read_text())
    assert report["reference"]["scan"] == report["resolved"]["reference_scan"] == "kernels"
    checks = report["reference"]["scan_checks"]
    assert sorted(map(int, checks)) == runner_module.ssm_layout(MODEL)[0]
    assert all(0 < value <= 1e-5 for check in checks.values() for value in check.values()), checks
    configs = {c["name"]: c for c in report["configs"]}
    assert configs["fp32"]["kl_mean"] == 0.0 and configs["nvfp4/fp16sr@8"]["kl_mean"] > 0


def test_kda_fixture_smoke(tmp_path):
    """tiny-kimi-linear through the KL CLI: a few tokens, open and closed fold, a shared checkpoint."""
    out = tmp_path / "run"
    code = main(["kl", "--model", "tiny-kimi-linear", "--tokens", "24", "--prompt-len", "16", "--num-docs", "1",
                 "--config", "fp32", "--config", "nvfp4/fp16sr@8", "--config", "nvfp4/fp16sr@8#closed",
                 "--config", "shared:nvfp4", "--segment-len", "8", "--device", "cpu", "--output", str(out)])
    assert code == 0
    configs = {c["name"]: c for c in json.loads((out / "kl.json").read_text())["configs"]}
    assert configs["fp32"]["kl_mean"] == 0.0
    assert all(configs[name]["kl_mean"] > 0 for name in ("nvfp4/fp16sr@8", "nvfp4/fp16sr@8#closed", "shared:nvfp4"))
    assert configs["nvfp4/fp16sr@8"]["state_traffic"]["geometry"]["family"] == "kda"


@pytest.fixture(scope="module")
def fp64_runner():
    """The runner with the model and every session's kernels in FP64 (`ReplaySession.compute_dtype`)."""
    runner = runner_module.load_runner(MODEL, device="cpu", dtype="float32", backend="torch", device_map=None)
    rm = runner.replay_model
    rm.model.double()
    rm.new_session = functools.partial(type(rm).new_session, rm, compute_dtype=torch.float64)
    return runner


# The driver (segments of 8 tokens through the chunked kernels) and the token-by-token decode sum in different
# orders. In FP32 that noise (~1e-7 relative) now and then puts an element within an ulp of a rounding boundary on
# different sides, on one CPU and not another; a flipped FP16 recurrence element persists and moves later NLLs by
# more than any bound fit to one machine's noise. Both paths run in FP64, so their noise (~1e-15 relative) flips no
# rounding: every stored code agrees, top-1 agreement is exact, and the metrics (log-softmax in FP32 of the logits
# rounded to FP32, NLLs of magnitude ~10) differ by at most a few FP32 ulps of the log-probabilities: 1e-5 for an NLL
# difference, 1e-6 for a KL (a sum of p x a few ulps). Measured: both paths give bit-identical metrics; in FP32 the
# same comparison differs by 1.2e-4 in one NLL for nvfp4/fp16@4 (a flipped FP16 element), by 1.1e-5 for nvfp4/fp32@8.
@pytest.mark.parametrize("config", [pytest.param("nvfp4/fp16@4", marks=pytest.mark.slow), "nvfp4/fp32@8"])
def test_driver_matches_token_by_token_decoding(fp64_runner, config):
    prompt_len, tokens = 16, 32
    ids = torch.tensor([list(b"When shall we three meet again? In thunder, lightning, or in rain?")])
    ids = ids[:, : prompt_len + tokens]  # [1, 48]
    cfg = ReplayConfig.parse(config)
    metrics, _ = evaluate_batch(fp64_runner, [cfg], ids, torch.tensor([5]), prompt_len, segment_len=8)
    got = torch.from_numpy(metrics[:, 0])  # [1, 5, tokens]

    fed = ids[:, :-1]  # the last token is only a target
    slow = {c: token_by_token_logits(fp64_runner.replay_model, fed, prompt_len=prompt_len, config=c, seq_ids=[5],
                                     compute_dtype=torch.float64) for c in ("fp32", cfg)}
    assert next(fp64_runner.replay_model.model.parameters()).dtype == torch.float64
    cols = slice(prompt_len - 1, None)  # the logits that predict generated tokens 1..tokens
    expected = token_metrics(slow["fp32"][:, cols], slow[cfg][:, cols], ids[:, prompt_len:])
    assert expected[0, 0].max() > 1e-4  # the config deviates far beyond the bound below
    torch.testing.assert_close(got[:, :2], expected[:, :2], rtol=0, atol=1e-6)  # KL, reverse KL
    torch.testing.assert_close(got[:, 2], expected[:, 2], rtol=0, atol=0)  # top-1 agreement
    torch.testing.assert_close(got[:, 3], expected[:, 3], rtol=0, atol=1e-5)  # NLL difference
    torch.testing.assert_close(got[:, 4], expected[:, 4], rtol=0, atol=1e-5)  # Δp


@pytest.mark.parametrize("model", [MODEL, pytest.param("tiny-qwen3.5", marks=pytest.mark.slow)])
def test_ctrl_c_mid_segment_then_resume_equals_an_uninterrupted_run(model, tmp_path, monkeypatch):
    """SIGINT when the reference is through segment 1 and the config is not; the snapshot of the HF caches
    and ReplayStates at the end of segment 1 continues to the uninterrupted numbers."""
    monkeypatch.setattr(output, "kl_vs_length_png", lambda report: b"")
    base = KLConfig(model=model, config=("nvfp4/fp16sr@8",), num_docs=2, batch_size=2, prompt_len=16, tokens=33,
                    segment_len=16, device="cpu", keep_token_metrics=True)
    straight = run_kl(dataclasses.replace(base, output=str(tmp_path / "straight")))

    extend = runner_module.ModelStream.extend
    calls = []

    def ctrl_c_in_segment_1(stream, tokens):
        calls.append(stream)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return extend(stream, tokens)

    monkeypatch.setattr(runner_module.ModelStream, "extend", ctrl_c_in_segment_1)
    broken = tmp_path / "broken"
    with pytest.raises(KeyboardInterrupt):
        run_kl(dataclasses.replace(base, output=str(broken)))
    assert len(calls) == 2 and (broken / "inflight" / "batch-000000.pt").exists()

    run_kl(KLConfig(resume=str(broken)))
    assert len(calls) == 2 + 2  # then segment 2 only
    report = {k: v for k, v in json.loads((broken / "kl.json").read_text()).items() if k not in VOLATILE}
    expected = {k: v for k, v in json.loads((straight / "kl.json").read_text()).items() if k not in VOLATILE}
    assert report == expected
    for name in ("doc-000000.npz", "doc-000001.npz"):
        with np.load(straight / "tokens" / name) as a, np.load(broken / "tokens" / name) as b:
            assert np.array_equal(a["metrics"], b["metrics"]) and np.array_equal(a["ref_nll"], b["ref_nll"])


@pytest.mark.parametrize("model", [MODEL, "tiny-qwen3.5"])
def test_skip_reads_are_counted(model, tmp_path, monkeypatch):
    """kl.json's skip_reads: reads skipped per layer and in total, > 0 for a large EPS, 0 for a tiny one, and the
    bytes saved follow the counts."""
    monkeypatch.setattr(output, "kl_vs_length_png", lambda report: b"")
    configs = ("nvfp4/fp16sr@8#skip=0.9", "nvfp4/fp16sr@8#skip=1e-30", "nvfp4/fp16sr@8")
    run = run_kl(KLConfig(model=model, config=configs, num_docs=1, batch_size=1, prompt_len=16, tokens=24,
                          segment_len=8, device="cpu", output=str(tmp_path / "run")))
    found = {c["name"]: c for c in json.loads((run / "kl.json").read_text())["configs"]}
    big, tiny = found[configs[0]]["skip_reads"], found[configs[1]]["skip_reads"]
    assert found[configs[2]]["skip_reads"] is None
    traffic = found[configs[0]]["state_traffic"]
    layers, heads = traffic["geometry"]["num_ssm_layers"], traffic["geometry"]["state"][0]
    assert len(big["per_layer"]) == layers
    assert big["total"]["reads"] == tiny["total"]["reads"] == layers * heads * 23  # decode tokens after the prompt
    assert big["total"]["skipped"] > 0 and tiny["total"]["skipped"] == 0
    assert big["total"]["skipped"] == sum(c["skipped"] for c in big["per_layer"].values())
    read, recur = traffic["bytes_per_copy"]["read"], traffic["bytes_per_copy"]["recur"]
    for c in big["per_layer"].values():
        expect = (c["skipped_read_copy"] * read + c["skipped_recur_copy"] * recur) / c["reads"]
        assert c["bytes_saved_per_token"] == pytest.approx(expect)
    assert big["total"]["bytes_saved_per_token"] > 0 and tiny["total"]["bytes_saved_per_token"] == 0
    assert big["total"]["replay_with_skip"] == pytest.approx(
        traffic["per_model"]["replay"] - big["total"]["bytes_saved_per_token"])

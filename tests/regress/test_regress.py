"""`replayssm-eval regress`: a broken rounding mode, format or kernel fails with a readable diff; updates."""

import dataclasses
import json
import shutil

import pytest
import torch

from replayssm_eval.cli import main
from replayssm_eval.formats.formats import ElementwiseFormat, NVFP4Format
from replayssm_eval.regress import compare
from replayssm_eval.regress import BASELINE
from replayssm_eval.regress.suite import run_suite

from tests.helpers.regress_adapters import truncating_fp16_encode

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
CHEAP = ["--part", "format", "--part", "bits"]


def _row(out: str, metric: str) -> str:
    return next(line for line in out.splitlines() if f" {metric} " in line)


def test_cheap_parts_match_the_committed_baseline(capsys):
    assert main(["regress", *CHEAP]) == 0
    assert "no regression" in capsys.readouterr().out


def test_deterministic():
    assert run_suite(("format", "bits")) == run_suite(("format", "bits"))


def test_fp16_truncation_instead_of_rne_fails(monkeypatch, capsys):
    monkeypatch.setattr(ElementwiseFormat, "encode", truncating_fp16_encode(ElementwiseFormat.encode))
    assert main(["regress", *CHEAP]) == 1
    out = capsys.readouterr().out
    assert _row(out, "bits/fp16").startswith("REGRESSED") and "changed" in _row(out, "bits/fp16")
    row = _row(out, "format/fp16/gaussian/rel_rms")  # truncation doubles the error
    assert row.startswith("REGRESSED") and "rtol 0.0001" in row
    assert "bits/bf16" not in out and "bits/fp16sr" not in out  # only the broken format moved
    assert "REGRESSED" in out.splitlines()[-1]


def test_nvfp4_scale_off_by_one_code_fails(monkeypatch, capsys):
    original = NVFP4Format.encode

    def encode(self, x, **kw):
        packed = original(self, x, **kw)
        scales = torch.where(packed.scales > 0, packed.scales + 1, packed.scales)  # one E4M3 code up
        return dataclasses.replace(packed, scales=scales)

    monkeypatch.setattr(NVFP4Format, "encode", encode)
    assert main(["regress", *CHEAP]) == 1
    out = capsys.readouterr().out
    for metric in ("bits/nvfp4", "bits/nvfp4:scale=row", "format/nvfp4/ssm/rel_rms"):
        assert _row(out, metric).startswith("REGRESSED"), metric
    assert "format/fp8/" not in out and "bits/mxfp4 " not in out


@pytest.mark.slow
def test_kernel_dropping_d_fails(monkeypatch, capsys):
    from replayssm_eval.kernels.mamba2 import triton_step as mamba2_triton

    original = mamba2_triton.decode_step_triton

    def broken(x, dt, A, B, C, D, state, config, **kw):
        y, new_state = original(x, dt, A, B, C, D, state, config, **kw)
        return y - D[:, None] * x, new_state

    monkeypatch.setattr(mamba2_triton, "decode_step_triton", broken)
    assert main(["regress", "--only", "kernel/mamba2/nvfp4/fp16sr@4/*"]) == 1
    out = capsys.readouterr().out
    row = _row(out, "kernel/mamba2/nvfp4/fp16sr@4/y_rel_rms")
    assert row.startswith("REGRESSED") and "atol 1e-05 + rtol 9" in row
    assert "hi_rel_rms" not in out.split("\n\n")[0]  # the state is right; only the output is wrong
    assert "kernel_error   1 REGRESSED, 1 ok" in out


def test_improvement_is_reported_and_recorded(tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    shutil.copy(BASELINE, baseline)
    data = json.loads(baseline.read_text())
    name = "format/nvfp4/gaussian/rel_rms"
    current = data["metrics"][name]["value"]
    data["metrics"][name]["value"] = 2 * current  # the baseline was worse: now it improved
    baseline.write_text(json.dumps(data))

    assert main(["regress", "--baseline", str(baseline), "--part", "format"]) == 0
    out = capsys.readouterr().out
    assert _row(out, name).startswith("improved") and "-50.0%" in _row(out, name)
    assert "1 metric(s) improved or new: record them with --update-baseline" in out

    assert main(["regress", "--baseline", str(baseline), "--part", "format", "--update-baseline"]) == 0
    updated = compare.read_baseline(baseline)
    assert updated[name]["value"] == current
    assert updated["bits/nvfp4"] == data["metrics"]["bits/nvfp4"]  # parts not run are kept


def test_a_regression_names_the_baseline_machine_when_it_differs(tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    data = json.loads(BASELINE.read_text())
    data["machine"] = {"platform": "Linux", "processor": "Some Other CPU", "cpu_capability": "AVX2"}
    data["metrics"]["format/fp16/gaussian/rel_rms"]["value"] /= 2  # the current error is 2x the recorded one
    baseline.write_text(json.dumps(data))
    assert main(["regress", "--baseline", str(baseline), "--part", "format"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].startswith("baseline recorded on: Some Other CPU (AVX2), python ")
    assert lines[-2].startswith("this run on: ") and f"torch {torch.__version__}," in lines[-2]

    data["metrics"]["format/fp16/gaussian/rel_rms"]["value"] *= 2
    baseline.write_text(json.dumps(data))
    assert main(["regress", "--baseline", str(baseline), "--part", "format"]) == 0
    assert "recorded on" not in capsys.readouterr().out  # only a failure needs the machines side by side


def test_update_records_a_regression_only_when_accepted(tmp_path, monkeypatch, capsys):
    baseline = tmp_path / "baseline.json"
    shutil.copy(BASELINE, baseline)
    before = compare.read_baseline(baseline)["bits/fp16"]
    monkeypatch.setattr(ElementwiseFormat, "encode", truncating_fp16_encode(ElementwiseFormat.encode))
    args = ["regress", "--baseline", str(baseline), "--part", "bits", "--update-baseline"]
    assert main(args) == 1
    assert compare.read_baseline(baseline)["bits/fp16"] == before
    assert main([*args, "--accept-regressions"]) == 0
    assert compare.read_baseline(baseline)["bits/fp16"] != before


def test_bad_options(capsys):
    assert main(["regress", "--part", "speed"]) == 2
    assert "unknown --part 'speed'; known: format, bits, kernel, chunked, kl, stats" in capsys.readouterr().err
    assert main(["regress", "--baseline", "/nonexistent.json"]) == 2
    assert "create it with --update-baseline" in capsys.readouterr().err

"""The suite's golden, reference, statistics and KL-formula metrics catch the bugs they are there for; the gate
refuses to check nothing; output paths and --only are checked before the suite runs."""

import dataclasses
import json

import pytest
import torch

from replayssm_eval.cli import main
from replayssm_eval.formats import formats, get_format, rounding
from replayssm_eval.formats.formats import IntFormat
from replayssm_eval.formats.rotation import Rotated
from replayssm_eval.generate import degeneration
from replayssm_eval.kl import metrics as kl_metrics
from replayssm_eval.regress import BASELINE, compare, golden, suite
from replayssm_eval.results import buckets

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def _regressed(out: str) -> set[str]:
    return {line.split()[1] for line in out.splitlines() if line.startswith("REGRESSED")}


def test_every_metric_of_the_suite_is_in_the_baseline():
    assert set(suite.metric_kinds()) == set(compare.read_baseline(BASELINE))
    kinds = suite.metric_kinds()
    assert kinds["kernel/mamba2/fp32@4#buf=bf16/ref_rel_rms"] == "reference_error"
    assert kinds["kl/tiny-qwen3.5/shared:nvfp4/64-128/reverse"] == "kl"
    assert kinds["kl/buckets/1-3/kl_ci_high"] == "statistic"
    assert not any(name.startswith("kl/tiny-") and "/ci_" in name for name in kinds)  # platform noise, not metrics
    assert kinds["stats/accuracy/n1/b0/cfg/p_value"] == "statistic"
    assert {"int8", "int16sr", "int8:scale=rowcol", "nvfp4:rot=hadamard:16", "fp8:max=240", "fp8sr:bits=12",
            "mxfp8:axis=headdim"} <= set(suite.FORMATS)


def test_cheap_parts_list_what_they_compute():
    parts = ("format", "bits", "stats")
    assert set(suite.run_suite(parts)) == set(suite.metric_kinds(parts))


def test_tie_state_sits_on_midpoints():
    x = golden.tie_state()
    blocks = x[2].view(16, 4, 16)[:, 1:]  # [P, 3, 16]: blocks whose k is a power of two, k * 6 first
    k = blocks[..., :1] / 6
    assert set((blocks[..., 1:] / k).abs().unique().tolist()) == set(golden.E2M1_TIES)
    assert set(x[1, :, 1:].abs().unique().tolist()) == set(golden.INT_TIES)
    # S_enc = 1 and block scale k: NVFP4 stores each scaled element as its E2M1 tie rounded to the even code
    fmt = get_format("nvfp4")
    got = fmt.decode(fmt.encode(x))[2].view(16, 4, 16)[:, 1:, 1:] / k
    even = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    want = (blocks[..., 1:] / k).abs().apply_(even.get) * torch.sign(blocks[..., 1:])
    assert torch.equal(got, want)


def _e2m1_ties_away(v: torch.Tensor) -> torch.Tensor:
    a = torch.clamp(v, -6, 6).abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    return torch.copysign(torch.floor(a / step + 0.5) * step, v)


def test_ties_away_from_zero_fail_the_tie_hashes(monkeypatch, capsys):
    monkeypatch.setattr(rounding, "round_e2m1", _e2m1_ties_away)
    assert main(["regress", "--part", "bits"]) == 1
    failed = _regressed(capsys.readouterr().out)
    assert {"bits/nvfp4/ties", "bits/mxfp4/ties", "bits/nvfp4:scale=tensor/ties"} <= failed
    assert not any(name.startswith(("bits/int8", "bits/fp8", "bits/buffer")) for name in failed)


def test_other_block_scale_order_fails_the_golden_rows(monkeypatch, capsys):
    monkeypatch.setattr(formats, "nvfp4_block_scale", lambda bmax, s_enc: rounding.round_e4m3((bmax / 6.0) * s_enc))
    assert main(["regress", "--part", "bits", "--show-all", "--only", "bits/nvfp4*"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if " bits/nvfp4/scale_order " in line)
    assert row.split()[:4] == ["REGRESSED", "bits/nvfp4/scale_order", "0", "64"]  # every golden row's second scale


def test_int8_scale_off_by_one_fails(monkeypatch, capsys):
    monkeypatch.setattr(IntFormat, "max_value", property(lambda self: float(self.qmax + 1)))
    assert main(["regress", "--part", "format", "--part", "bits"]) == 1
    failed = _regressed(capsys.readouterr().out)
    assert {"bits/int8", "bits/int16:scale=block:32", "format/int8:scale=rowcol/ssm/rel_rms"} <= failed
    assert not any(name.startswith(("bits/fp8", "bits/nvfp4")) for name in failed)


def test_hadamard_decode_without_the_inverse_fails(monkeypatch, capsys):
    monkeypatch.setattr(Rotated, "decode", lambda self, packed: self.inner.decode(
        dataclasses.replace(packed, format=self.inner.name)))
    assert main(["regress", "--part", "format"]) == 1
    failed = _regressed(capsys.readouterr().out)
    assert failed == {f"format/{spec}/{d}/rel_rms" for spec in suite.FORMATS if "hadamard" in spec
                      for d in suite.DISTRIBUTIONS}


def test_kl_direction_and_interval_dof_fail(monkeypatch, capsys):
    forward = kl_metrics._kl
    monkeypatch.setattr(kl_metrics, "_kl", lambda logp, logq: forward(logq, logp))  # KL(q||p) in both columns' place
    assert main(["regress", "--part", "kl", "--only", "kl/formula/*"]) == 1
    assert _regressed(capsys.readouterr().out) == {f"kl/formula/t{t}/{m}" for t in range(3) for m in ("kl", "reverse_kl")}
    monkeypatch.undo()

    def t_interval_n_dof(doc_means):  # the t quantile with n degrees of freedom, not n - 1
        n, mean = len(doc_means), float(doc_means.mean())
        half = float(buckets.stats.t.ppf(0.975, n) * doc_means.std(ddof=1) / n**0.5)
        return max(0.0, mean - half), mean + half

    monkeypatch.setattr(buckets, "mean_interval", t_interval_n_dof)
    assert main(["regress", "--part", "kl", "--only", "kl/buckets/*"]) == 1
    assert _regressed(capsys.readouterr().out) == {f"kl/buckets/{b}/kl_ci_{s}" for b in ("1-3", "4-8") for s in ("low", "high")}


def test_loop_detector_with_three_copies_fails(monkeypatch, capsys):
    monkeypatch.setattr(degeneration, "MIN_REPEATS", 3)
    assert main(["regress", "--part", "stats"]) == 1
    failed = _regressed(capsys.readouterr().out)
    assert "stats/loop/p25_x3" in failed and "stats/accuracy/n1/all/cfg/loop_rate" in failed
    assert "stats/accuracy/n1/all/cfg/p_value" not in failed  # correctness and lengths are untouched


def test_two_sided_kinds_fail_a_move_either_way():
    assert compare.status_of("statistic", 0.5, 0.5 + 1e-7) == "ok"
    assert compare.status_of("statistic", 0.5, 0.49) == "REGRESSED"
    assert compare.status_of("reference_error", 1e-3, 1.01e-3) == "ok"
    assert compare.status_of("reference_error", 1e-3, 1e-7) == "REGRESSED"  # a rounding that stopped rounding
    assert compare.status_of("kl", 0.02, 0.007) == "REGRESSED"  # a format's cost that vanished: a rounding skipped
    assert compare.status_of("kl", 0.02, 0.021) == "ok"


def test_a_gate_that_checks_nothing_fails(tmp_path, capsys, monkeypatch):
    assert main(["regress", "--part", "kernel", "--only", "format/*"]) == 2
    err = capsys.readouterr().err
    assert "--only 'format/*' matches no metric of --part kernel; known, e.g.: kernel/encode/*" in err
    other = tmp_path / "baseline.json"
    data = json.loads(BASELINE.read_text())
    data["metrics"] = {k: v for k, v in data["metrics"].items() if not k.startswith("stats/")}
    other.write_text(json.dumps(data))
    assert main(["regress", "--baseline", str(other), "--part", "stats"]) == 1  # every metric new: none compared
    assert "none compared with the baseline" in capsys.readouterr().out


def test_output_and_only_are_checked_before_the_suite_runs(tmp_path, capsys, monkeypatch):
    def no_run(*args, **kwargs):
        raise AssertionError("the suite ran")

    monkeypatch.setattr(suite, "run_suite", no_run)
    assert main(["regress", "--part", "stats", "--json-output", str(tmp_path)]) == 2
    assert f"--json-output {str(tmp_path)!r} is a folder" in capsys.readouterr().err
    assert main(["regress", "--part", "stats", "--json-output", str(tmp_path / "no" / "x.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    monkeypatch.setattr("os.access", lambda path, mode: False)  # a read-only filesystem
    assert main(["regress", "--part", "stats", "--json-output", str(tmp_path / "x.json")]) == 2
    assert "is not writable" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setattr(suite, "run_suite", no_run)
    assert main(["regress", "--update-baseline", "--baseline", str(tmp_path / "b.json"), "--only", "nothing*"]) == 2
    err = capsys.readouterr().err
    assert "--only 'nothing*' matches no metric" in err and "bits/bf16, chunked/gdn/*" in err
    assert not (tmp_path / "b.json").exists()


def test_triton_encoder_hashes_equal_the_torch_encoders():
    """The baseline's `kernel/encode` hashes (Triton) are the `bits` hashes (torch) of the same inputs."""
    base = compare.read_baseline(BASELINE)
    for spec in suite.ENCODE_FORMATS:
        assert base[f"kernel/encode/{spec}/integer"] == base[f"bits/{spec}"], spec
        assert base[f"kernel/encode/{spec}/ties"] == base[f"bits/{spec}/ties"], spec
    assert {base[f"{p}/{spec}/scale_order"]["value"] for p in ("bits", "kernel/encode")
            for spec in suite.NVFP4_SCALE_ORDER} == {0}

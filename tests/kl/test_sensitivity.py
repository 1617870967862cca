"""`replayssm-eval sensitivity` on the fake model (tests/helpers/kl_fakes: its hidden channels stand for SSM layers
0, 2, 4 of 4 heads, and a variant rounds only the channels of its non-FP32 parts): the variants, the ranking,
the heads stage, resume after Ctrl-C, and the report's section."""

import dataclasses
import json

import pytest

from replayssm_eval.kl.driver import run_kl
from replayssm_eval.kl.options import KLConfig, SensitivityConfig
from replayssm_eval.kl.sensitivity import head_variants, layer_variants, most_sensitive, run_sensitivity
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.reports.load import load_results
from replayssm_eval.reports.render import build_report

from tests.helpers.kl_fakes import FAKE_MODEL

C = ReplayConfig.parse("bf16/fp32@8")


@pytest.fixture
def study(tmp_path):
    def make(**changes):
        base = SensitivityConfig(model=FAKE_MODEL, config=(C.name,), num_docs=2, prompt_len=40, tokens=64,
                                 segment_len=32, device="cpu", output=str(tmp_path / "study"))
        return dataclasses.replace(base, **changes)

    return make


def test_variants():
    assert layer_variants(C, [0, 2]) == ("bf16/fp32@8", "fp32+0=bf16/fp32@8", "bf16/fp32@8+0=fp32",
                                         "fp32+2=bf16/fp32@8", "bf16/fp32@8+2=fp32")
    assert head_variants(C, [4], 2) == ("fp32+4.h0=bf16/fp32@8", "bf16/fp32@8+4.h0=fp32",
                                        "fp32+4.h1=bf16/fp32@8", "bf16/fp32@8+4.h1=fp32")
    rows = [{"layer": layer, "only": {"kl_mean": kl}} for layer, kl in ((0, 3.0), (2, 1.0), (4, 2.0))]
    assert most_sensitive(rows, 2) == [0, 4]


def test_layers_and_heads_stages(fake, study, tmp_path):
    fake()
    run_dir = run_sensitivity(study(heads=1))
    report = json.loads((run_dir / "sensitivity.json").read_text())
    assert report["complete"] and report["config"] == C.name and [r["layer"] for r in report["layers"]] == [0, 2, 4]
    assert sorted(r["rank"] for r in report["layers"]) == [1, 2, 3]
    top = min(report["layers"], key=lambda r: r["rank"])
    assert all(top["only"]["kl_mean"] >= r["only"]["kl_mean"] > 0 for r in report["layers"])
    assert [(h["layer"], h["head"]) for h in report["heads"]] == [(top["layer"], h) for h in range(4)]
    assert report["additive"]["sum_only"] == pytest.approx(sum(r["only"]["kl_mean"] for r in report["layers"]))
    # the lockstep stage equals a kl run of the variant alone
    alone = run_kl(KLConfig(model=FAKE_MODEL, config=("fp32+2=bf16/fp32@8",), num_docs=2, prompt_len=40, tokens=64,
                            segment_len=32, device="cpu", output=str(tmp_path / "alone")))
    only_2 = next(r["only"] for r in report["layers"] if r["layer"] == 2)
    assert json.loads((alone / "kl.json").read_text())["configs"][0]["kl_mean"] == only_2["kl_mean"]
    # the report reads the study through sensitivity.json, not its stages' kl.json
    results = load_results([run_dir])
    assert [r.kind for r in results] == ["sensitivity"]
    section = next(s for s in build_report(results).sections if s.id == "sensitivity")
    assert [type(b).__name__ for b in section.blocks] == ["Table", "Image", "Table", "Image"]
    assert section.blocks[0].rows[0][:2] == ["1", str(top["layer"])]


def test_ctrl_c_in_the_heads_stage_then_resume(fake, study, tmp_path):
    fake()
    straight = json.loads((run_sensitivity(study(heads=1, output=str(tmp_path / "a"))) / "sensitivity.json").read_text())
    loaded = {}

    def in_heads_stage():  # each stage loads its own runner; the second is the heads stage's
        if len(loaded["runners"]) == 2:
            raise KeyboardInterrupt

    loaded["runners"] = fake(fail_after=20, fault=in_heads_stage)
    with pytest.raises(KeyboardInterrupt):
        run_sensitivity(study(heads=1, output=str(tmp_path / "b")))
    partial = json.loads((tmp_path / "b" / "sensitivity.json").read_text())
    assert not partial["complete"] and partial["heads"] == []
    fake()
    resumed = json.loads((run_sensitivity(SensitivityConfig(resume=str(tmp_path / "b"))) / "sensitivity.json").read_text())
    for key in ("uniform", "layers", "heads", "additive", "complete"):
        assert resumed[key] == straight[key], key


@pytest.mark.parametrize("changes, message", [
    ({"config": ("fp32",)}, r"^--config fp32: sensitivity studies one config; accepted: one plain config"),
    ({"config": ("bf16", "fp8")}, r"^--config bf16, fp8: sensitivity studies one config"),
    ({"config": ("bf16+0=fp32",)}, r"^--config bf16\+0=fp32: sensitivity studies one config"),
    ({"heads": 4}, r"^--heads 4 is out of range; accepted: 0\.\.3 \(the model's SSM layers\)$"),
])
def test_bad_options(fake, study, changes, message):
    fake()
    with pytest.raises(ValueError, match=message):
        run_sensitivity(study(**changes))


def test_resume_needs_a_study(fake, study, tmp_path):
    fake()
    with pytest.raises(ValueError, match="no sensitivity run.json there; accepted: a sensitivity run directory"):
        run_sensitivity(SensitivityConfig(resume=str(tmp_path)))

"""The KL driver on the fake model: exact zero for fp32, resume, segment alignment, bad input."""

import json

import numpy as np
import pytest

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kl.driver import aligned_segment_len, run_kl
from replayssm_eval.kl.options import KLConfig

from tests.helpers.kl_fakes import kl_results


def _report(run_dir) -> dict:
    return json.loads((run_dir / "kl.json").read_text())


def test_fp32_config_gives_exactly_zero(fake, small):
    runners = fake()
    run_dir = run_kl(small(keep_token_metrics=True))
    report = _report(run_dir)
    assert report["complete"] and report["documents_done"] == 3
    by_name = {c["name"]: c for c in report["configs"]}
    assert by_name["fp32"]["kl_mean"] == 0.0
    assert all(b["kl_p99"] == 0.0 and b["top1_agree"] == 1.0 for b in by_name["fp32"]["buckets"])
    for name in ("shared:bf16", "bf16/fp32@8"):
        assert by_name[name]["kl_mean"] > 0 and by_name[name]["buckets"][-1]["kl_mean"] > 0
    with np.load(run_dir / "tokens" / "doc-000000.npz") as doc:
        assert doc["metrics"].shape == (3, 5, 150)
        assert (doc["metrics"][0, [0, 1, 3, 4]] == 0).all() and (doc["metrics"][0, 2] == 1).all()
    assert all(s.closed for r in runners for s in r.opened)
    files = {"run.json", "kl.json", "kl_buckets.csv", "kl_vs_length.png", "tokens"}
    assert {p.name for p in run_dir.iterdir()} == files


def test_resume_equals_uninterrupted(fake, small, tmp_path):
    fake()
    straight = run_kl(small(output=str(tmp_path / "straight"), keep_token_metrics=True))

    fake(fail_after=30)  # 20 extend calls per document (4 streams x 5 segments): stops inside document 1
    options = small(output=str(tmp_path / "broken"), keep_token_metrics=True)
    with pytest.raises(KeyboardInterrupt):
        run_kl(options)
    broken = tmp_path / "broken"
    partial = json.loads((broken / "kl.json").read_text())
    assert not partial["complete"] and partial["document_indices"] == [0]
    assert not (broken / "kl_vs_length.png").exists()
    assert sorted(p.name for p in (broken / "tokens").iterdir()) == ["doc-000000.npz"]

    runners = fake()
    resumed = run_kl(KLConfig(resume=str(broken)))
    assert resumed == broken
    assert len(runners[0].opened) == 2 * 4  # only documents 1 and 2 were recomputed
    assert kl_results(resumed) == kl_results(straight)
    for i in range(3):
        name = f"doc-{i:06d}.npz"
        with np.load(straight / "tokens" / name) as a, np.load(resumed / "tokens" / name) as b:
            assert np.array_equal(a["metrics"], b["metrics"]) and np.array_equal(a["ref_nll"], b["ref_nll"])


def test_resume_of_a_complete_run_does_nothing(fake, small):
    fake()
    run_dir = run_kl(small())
    before = (run_dir / "kl.json").read_bytes()
    runners = fake()
    run_kl(KLConfig(resume=str(run_dir)))
    assert runners == [] and (run_dir / "kl.json").read_bytes() == before


def test_resume_rejects_different_options(fake, small):
    fake(fail_after=3)
    options = small()
    with pytest.raises(KeyboardInterrupt):
        run_kl(options)
    with pytest.raises(ValueError, match=r"--tokens 100 differs from the resumed run's 150"):
        run_kl(KLConfig(resume=options.output, tokens=100))


def test_segments_are_aligned_to_every_window():
    configs = [ReplayConfig.parse(s) for s in ("fp32", "shared:nvfp4", "nvfp4/fp32@12", "fp16sr#spec=3:0.5")]
    assert aligned_segment_len(100, configs) == 144  # lcm(1, 16, 12) = 48
    assert aligned_segment_len(96, configs) == 96


def test_batches_and_segment_lengths_do_not_change_the_numbers(fake, small, tmp_path):
    fake()
    base = kl_results(run_kl(small(output=str(tmp_path / "a"))))
    other = kl_results(run_kl(small(output=str(tmp_path / "b"), batch_size=2, segment_len=40)))
    report = _report(tmp_path / "b")
    assert report["resolved"]["segment_len"] == 48  # rounded up to a multiple of lcm(1, 16, 8)
    for a, b in zip(base["configs"], other["configs"]):
        for x, y in zip(a["buckets"], b["buckets"]):
            assert x["kl_mean"] == pytest.approx(y["kl_mean"], rel=1e-5, abs=1e-9)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"config": ("nvfp5/fp32",)}, "nvfp5"),
        ({"config": ("shared:bf16", "shared:bf16")}, "given more than once"),
        ({"model": "no-such-model"}, "unknown model 'no-such-model'"),
        ({"tokens": 131073}, r"--tokens 131073 is out of range; accepted: 1..131072"),
        ({"tokens": 131072}, r"bundled text has \d+ tokens"),
        ({"data_files": ("missing.jsonl",)}, "no such file"),
        ({"seed": 3}, "--seed 3 belongs to the short form"),
        ({"buckets": "log:zero"}, "bad bucket spec"),
        ({"prompt_len": 0}, "--prompt-len must be >= 1"),
    ],
)
def test_bad_input_writes_nothing(fake, small, tmp_path, changes, message):
    runners = fake()
    options = small(**changes)
    with pytest.raises(ValueError, match=message):
        run_kl(options)
    assert runners == []  # no model was loaded
    assert not (tmp_path / "run").exists()


def test_existing_output_is_not_overwritten(fake, small, tmp_path):
    fake()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        run_kl(small())
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["notes.txt"]

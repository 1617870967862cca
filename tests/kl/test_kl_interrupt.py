"""Ctrl-C, a second Ctrl-C and a crash in the middle of a segment; `--resume` gives the uninterrupted numbers.

The fake run (conftest `small`): 3 documents of 150 generated tokens in batches of 1, segments of
32, 4 streams (fp32 reference + 3 configs): 5 segments, so 20 `extend` calls, per document.
`fail_after=30` faults at the start of call 31: document 1, segment 3 (generated tokens 66..97), with
the reference and one config already through it and two configs not.
"""

import json
import signal

import numpy as np
import pytest
import torch.multiprocessing as mp

from replayssm_eval.kl import output
from replayssm_eval.kl.driver import run_kl
from replayssm_eval.kl.options import KLConfig

from tests.helpers.kl_fakes import crash, ctrl_c, free_port, kl_results, run_rank

@pytest.fixture(autouse=True)
def _no_plot(monkeypatch):
    """The plot is not under test here and takes most of a fake run's time."""
    monkeypatch.setattr(output, "kl_vs_length_png", lambda report: b"")


@pytest.fixture
def straight(fake, small, tmp_path):
    """The uninterrupted run, with its token metrics."""
    fake()
    return run_kl(small(output=str(tmp_path / "straight"), keep_token_metrics=True))


def _partial(run_dir, first_doc):
    with np.load(run_dir / "inflight" / f"batch-{first_doc:06d}.npz") as data:
        return data["metrics"], data["ref_nll"]


def _assert_same_token_metrics(a, b, indices=range(3)):
    for i in indices:
        name = f"doc-{i:06d}.npz"
        with np.load(a / "tokens" / name) as x, np.load(b / "tokens" / name) as y:
            assert np.array_equal(x["metrics"], y["metrics"]) and np.array_equal(x["ref_nll"], y["ref_nll"])


def _interrupt(fake, small, tmp_path, fault):
    fake(fail_after=30, fault=fault)
    options = small(output=str(tmp_path / "broken"), keep_token_metrics=True)
    with pytest.raises(KeyboardInterrupt):
        run_kl(options)
    return tmp_path / "broken"


def test_ctrl_c_finishes_the_segment_and_resume_continues_there(fake, small, tmp_path, straight, capfd):
    broken = _interrupt(fake, small, tmp_path, ctrl_c())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the driver's handler is gone
    err = capfd.readouterr().err
    assert "Ctrl-C again" in err and f"replayssm-eval kl --resume {broken}" in err
    assert sorted(p.name for p in (broken / "inflight").iterdir()) == ["batch-000001.npz", "batch-000001.pt"]
    metrics, ref_nll = _partial(broken, 1)
    assert metrics.shape == (1, 3, 5, 97)  # segment 3 was finished: generated tokens 1..97
    with np.load(straight / "tokens" / "doc-000001.npz") as doc:
        assert np.array_equal(metrics[0], doc["metrics"][..., :97]) and np.array_equal(ref_nll[0], doc["ref_nll"][:97])

    runners = fake()
    resumed = run_kl(KLConfig(resume=str(broken)))
    assert runners[0].extends == 4 * 2 + 4 * 5  # document 1's last 2 segments, document 2's 5
    assert kl_results(resumed) == kl_results(straight)
    _assert_same_token_metrics(straight, resumed)
    assert not (resumed / "inflight").exists()


def test_second_ctrl_c_stops_at_once_and_the_batch_restarts(fake, small, tmp_path, straight):
    broken = _interrupt(fake, small, tmp_path, ctrl_c(times=2))
    assert [p.name for p in (broken / "inflight").iterdir()] == ["batch-000001.npz"]  # no snapshot
    assert _partial(broken, 1)[0].shape[-1] == 65  # the segments done before the interrupted one

    runners = fake()
    resumed = run_kl(KLConfig(resume=str(broken)))
    assert runners[0].extends == 4 * 5 * 2  # documents 1 and 2 from their start
    assert kl_results(resumed) == kl_results(straight)
    _assert_same_token_metrics(straight, resumed)


def test_crash_keeps_the_finished_segments_and_resumes(fake, small, tmp_path, straight):
    fake(fail_after=30, fault=crash)
    options = small(output=str(tmp_path / "broken"), keep_token_metrics=True)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_kl(options)
    broken = tmp_path / "broken"
    assert [p.name for p in (broken / "inflight").iterdir()] == ["batch-000001.npz"]
    metrics, ref_nll = _partial(broken, 1)
    with np.load(straight / "tokens" / "doc-000001.npz") as doc:
        assert np.array_equal(metrics[0], doc["metrics"][..., :65]) and np.array_equal(ref_nll[0], doc["ref_nll"][:65])

    fake()
    resumed = run_kl(KLConfig(resume=str(broken)))
    assert kl_results(resumed) == kl_results(straight)
    _assert_same_token_metrics(straight, resumed)


def test_ctrl_c_in_the_last_segment_stores_the_batch_and_stops(fake, small, tmp_path, straight):
    broken = _interrupt(fake, small, tmp_path, ctrl_c())
    fake(fail_after=5, fault=ctrl_c())  # resumed from the snapshot: document 1's last segment
    with pytest.raises(KeyboardInterrupt):
        run_kl(KLConfig(resume=str(broken)))
    assert json.loads((broken / "kl.json").read_text())["document_indices"] == [0, 1]
    assert not (broken / "inflight" / "batch-000001.pt").exists()  # nothing left to continue

    runners = fake()
    resumed = run_kl(KLConfig(resume=str(broken)))
    assert runners[0].extends == 4 * 5  # document 2
    assert kl_results(resumed) == kl_results(straight)


@pytest.mark.slow
def test_each_rank_snapshots_its_own_batch(fake, small, tmp_path, straight):
    fake()
    options = small(output=str(tmp_path / "two"), keep_token_metrics=True)
    # both ranks get Ctrl-C in their first document (rank 0: document 0, rank 1: document 1), segment 3
    mp.start_processes(run_rank, args=(2, free_port(), options, 10, ctrl_c()), nprocs=2, join=True,
                       start_method="fork")
    inflight = sorted(p.name for p in (tmp_path / "two" / "inflight").iterdir())
    assert inflight == ["batch-000000.npz", "batch-000000.pt", "batch-000001.npz", "batch-000001.pt"]
    resumed = KLConfig(resume=options.output)
    mp.start_processes(run_rank, args=(2, free_port(), resumed), nprocs=2, join=True, start_method="fork")
    assert kl_results(tmp_path / "two") == kl_results(straight)
    _assert_same_token_metrics(straight, tmp_path / "two")

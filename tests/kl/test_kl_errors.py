"""Bad input to `replayssm-eval kl`: one line on stderr, exit status 2, and no run directory left behind."""

import json
import os

import pytest

from replayssm_eval.cli import main
from replayssm_eval.kl import driver
from replayssm_eval.results.files import read_json

from tests.helpers.kl_fakes import FAKE_MODEL

ARGS = ["kl", "--model", FAKE_MODEL, "--device", "cpu", "--num-docs", "2", "--prompt-len", "16",
        "--tokens", "40", "--segment-len", "16", "--config", "fp32"]


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("replayssm-eval kl: error: "), err
    return err


def test_triton_backend_on_a_cpu_machine(fake, tmp_path, capsys, monkeypatch):
    runners = fake()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "run"
    assert main([*ARGS, "--backend", "triton", "--output", str(out)]) == 2
    err = _error(capsys)
    assert "--backend triton needs a CUDA device" in err and "--backend torch" in err and "TRITON_INTERPRET=1" in err
    assert not out.exists() and not runners


def test_output_under_a_file_fails_before_loading(fake, tmp_path, capsys):
    runners = fake()
    (tmp_path / "some_file").write_text("")
    out = tmp_path / "some_file" / "out"
    assert main([*ARGS, "--output", str(out)]) == 2
    err = _error(capsys)
    assert f"--output {str(out)!r} cannot be created: {tmp_path / 'some_file'} is a file" in err
    assert not runners  # no model was loaded


def test_read_only_output_fails_before_loading(fake, tmp_path, capsys, monkeypatch):
    runners = fake()
    read_only = tmp_path / "ro"
    read_only.mkdir()
    real_access = os.access
    monkeypatch.setattr(driver.os, "access", lambda p, mode: False if str(p) == str(read_only) else real_access(p, mode))
    out = read_only / "run"
    assert main([*ARGS, "--output", str(out)]) == 2
    assert f"{read_only} is not writable" in _error(capsys)
    assert not out.exists() and not runners


def _finished_run(tmp_path) -> str:
    out = tmp_path / "run"
    assert main([*ARGS, "--output", str(out), "--keep-token-metrics"]) == 0
    return str(out)


def test_truncated_document_file_on_resume_names_it(fake, small, tmp_path, capsys):
    fake()
    out = _finished_run(tmp_path)
    kl = json.loads((tmp_path / "run" / "kl.json").read_text())
    (tmp_path / "run" / "kl.json").write_text(json.dumps({**kl, "complete": False}))  # as if interrupted
    doc = tmp_path / "run" / "tokens" / "doc-000001.npz"
    doc.write_bytes(doc.read_bytes()[:100])
    capsys.readouterr()
    assert main(["kl", "--resume", out]) == 2
    err = _error(capsys)
    assert str(doc) in err and "delete it and --resume again to redo document 1" in err

    doc.unlink()  # what the message says: the document is redone
    assert main(["kl", "--resume", out]) == 0
    assert json.loads((tmp_path / "run" / "kl.json").read_text())["document_indices"] == [0, 1]


def test_truncated_snapshot_on_resume_names_it(fake, tmp_path, capsys):
    fake()
    out = _finished_run(tmp_path)
    run = tmp_path / "run"
    kl = json.loads((run / "kl.json").read_text())
    (run / "kl.json").write_text(json.dumps({**kl, "complete": False}))
    (run / "tokens" / "doc-000001.npz").unlink()
    snapshot = run / "inflight" / "batch-000001.pt"
    snapshot.parent.mkdir()
    snapshot.write_bytes(b"PK\x03\x04 truncated")
    capsys.readouterr()
    assert main(["kl", "--resume", out]) == 2
    err = _error(capsys)
    assert str(snapshot) in err and "delete it and --resume again to redo documents [1] from their start" in err


@pytest.mark.parametrize("name", ["run.json", "kl.json"])
def test_corrupt_json_on_resume_names_the_file(fake, tmp_path, capsys, name):
    fake()
    out = _finished_run(tmp_path)
    path = tmp_path / "run" / name
    path.write_text(path.read_text()[:50])
    capsys.readouterr()
    assert main(["kl", "--resume", out]) == 2
    assert f"{path} is not valid JSON" in _error(capsys)


def test_read_json_names_the_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"\xff{")
    with pytest.raises(ValueError, match="x.json is not valid JSON"):
        read_json(path)


def test_unknown_model_offline_fails_at_once(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "run"
    assert main(["kl", "--model", "zzz-no-such-model", "--device", "cpu", "--output", str(out)]) == 2
    err = _error(capsys)
    assert "model 'zzz-no-such-model' is not a bundled fixture" in err and "HF_HUB_OFFLINE is set" in err
    assert "tiny-nemotron-h, tiny-qwen3.5" in err
    assert not out.exists()


def test_unknown_model_with_the_hub_unreachable_fails_at_once(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    from replayssm_eval.models import fixtures

    def refuse(address, timeout):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(fixtures.socket, "create_connection", refuse)
    out = tmp_path / "run"
    assert main(["kl", "--model", "someone/zzz-no-such-model", "--device", "cpu", "--output", str(out)]) == 2
    assert "the hub (huggingface.co) is unreachable" in _error(capsys)
    assert not out.exists()


def test_directory_that_is_not_a_model(tmp_path, capsys):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    out = tmp_path / "run"
    assert main(["kl", "--model", str(folder), "--device", "cpu", "--output", str(out)]) == 2
    assert f"model {str(folder)!r} is a directory without config.json" in _error(capsys)
    assert not out.exists()


def test_progress_moves_within_a_segment(fake, small, monkeypatch):
    """The bar steps at most 16 tokens x documents at a time with segments of 64, and ends at the exact total."""
    steps = []
    real_move = driver.SegmentProgress._move_to

    def move_to(self, target):
        steps.append(target - self.moved)
        real_move(self, target)

    monkeypatch.setattr(driver.SegmentProgress, "_move_to", move_to)
    fake()
    driver.run_kl(small(segment_len=64, num_docs=2, batch_size=2))
    moved = [n for n in steps if n > 0]
    assert sum(moved) == 2 * 150 and max(moved) <= 16 * 2 and len(moved) > 50

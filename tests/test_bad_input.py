"""Every row of docs/errors.md, run through the real entry point in this process: one error line naming the
bad value, exit status 2, no traceback, nothing else printed (lm-eval's own log lines aside).

The rows of `replayssm-eval` fail before any model work (a few load the tiny fixture model: a config it
cannot run, a foreign snapshot); the `python -m replayssm_eval.accuracy` rows go through lm-eval's own CLI.
"""

import dataclasses
import json
import logging
import os
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
import torch

from replayssm_eval.accuracy.options import AccuracyConfig
from replayssm_eval.cli import main
from replayssm_eval.kl.options import KLConfig

TABLE = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
ROW = re.compile(r"^\| `(?P<command>[^`]+)` \| `(?P<value>[^`]+)` \| `(?P<error>[^`]+)` \|$")
LM_EVAL_LOG = re.compile(r"^\d{4}-\d{2}-\d{2}:\d{2}:\d{2}:\d{2} (DEBUG|INFO|WARNING) ")  # lm-eval's own logging
KL_RUN_OPTIONS = dict(model="tiny-nemotron-h", config=("fp32",), num_docs=1, prompt_len=16, tokens=32, device="cpu")


def rows() -> list[tuple[str, str, str]]:
    """(command, bad value, error) of every table row; a row that does not parse fails here, not silently."""
    lines = [line for line in TABLE.read_text().splitlines() if line.startswith("| `")]
    unparsed = [line for line in lines if not ROW.match(line)]
    assert lines and not unparsed, f"{TABLE}: rows that are not | `command` | `value` | `error` |: {unparsed}"
    return [(m["command"], m["value"], m["error"]) for m in map(ROW.match, lines)]


def test_every_value_appears_in_its_command():
    for command, value, _ in rows():
        assert value in command, (command, value)


def _places(tmp_path: Path, monkeypatch) -> dict[str, str]:
    """The paths the table's capitalised words stand for."""
    file = tmp_path / "file.txt"
    file.write_text("not a folder\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.access(read_only, os.W_OK):  # root writes anywhere: make the check see what a user would
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(read_only) else real_access(p, mode))
    accuracy_run = tmp_path / "accuracy_run"
    accuracy_run.mkdir()
    (accuracy_run / "run.json").write_text(json.dumps({"options": dataclasses.asdict(AccuracyConfig())}))
    kl_runs = {}
    for name in ("kl_run", "snapshot_run"):
        run = tmp_path / name
        run.mkdir()
        options = KLConfig(**KL_RUN_OPTIONS, output=str(run))
        (run / "run.json").write_text(json.dumps({"options": dataclasses.asdict(options)}))
        kl_runs[name] = run
    (kl_runs["snapshot_run"] / "inflight").mkdir()
    foreign = {"generated": 1, "metrics": torch.zeros(1, 3, 5, 1), "ref_nll": torch.zeros(1, 1), "streams": [{}] * 4}
    torch.save(foreign, kl_runs["snapshot_run"] / "inflight" / "batch-000000.pt")
    truncated = tmp_path / "generations.jsonl"
    truncated.write_text('{"config": "fp32", "task": "gpqa_diamond", "doc_id": 0, "text": "A"}\n{"config": "fp32", "ta')
    return {"SNAPSHOT_RUN": str(kl_runs["snapshot_run"]), "KL_RUN": str(kl_runs["kl_run"]),
            "ACCURACY_RUN": str(accuracy_run), "READ_ONLY": str(read_only), "TRUNCATED": str(truncated),
            "FOLDER": str(folder), "FILE": str(file)}


def _run(words: list[str], monkeypatch) -> int:
    """`replayssm-eval ...` through `cli.main`, `python -m replayssm_eval.accuracy ...` as its module runs."""
    if words[0] == "replayssm-eval":
        return main(words[1:])
    assert words[:3] == ["python", "-m", "replayssm_eval.accuracy"], words
    monkeypatch.setattr(sys, "argv", ["replayssm_eval.accuracy", *words[3:]])
    for handler in logging.getLogger("lm_eval").handlers:  # set up by an earlier run, on that run's captured stderr
        if isinstance(handler, logging.StreamHandler):
            monkeypatch.setattr(handler, "stream", sys.stderr)
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("replayssm_eval.accuracy", run_name="__main__")
    return exit_.value.code


def cases() -> list:
    """The rows as test cases; lm-eval's command line indexes all of lm-eval's tasks first (about 10 s): slow tier."""
    return [pytest.param(*row, id=row[0].split(" ", 1)[1],
                         marks=[pytest.mark.slow] if row[0].startswith("python -m") else [])
            for row in rows()]


@pytest.mark.parametrize("command, value, error", cases())
def test_bad_input_gives_the_documented_error(command, value, error, tmp_path, monkeypatch, capsys):
    if "cuda" in value and torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    monkeypatch.chdir(tmp_path)
    places = _places(tmp_path, monkeypatch)
    for word, path in places.items():
        command, value, error = (s.replace(word, path) for s in (command, value, error))
    code = _run(shlex.split(command), monkeypatch)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip() and not LM_EVAL_LOG.match(line)]
    assert code == 2, err
    assert "Traceback" not in err and not out.strip(), (out, err)
    assert len(lines) == 1, err
    assert value in lines[0] and error in lines[0], lines[0]

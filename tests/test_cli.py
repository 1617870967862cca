"""The `replayssm-eval` command itself: a light --help with every default, and one-line errors (exit 2)."""

import json
import subprocess
import sys

import pytest

from replayssm_eval.cli import build_parser, main


def _one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"replayssm-eval {command}: error: "), err
    return err


def test_help_imports_no_torch():
    """Building the parser for `--help` and for `kl --help` imports neither torch nor transformers."""
    code = ("import sys; from replayssm_eval.cli import build_parser; build_parser(['--help']); build_parser(['kl']); "
            "print(sorted(m for m in ('torch', 'transformers', 'pandas', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["kl", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: 2048)", "(default: 256)", "(default: 3)", "(default: tiny-nemotron-h)",
                  "(default: pow2)", "FP32 summation order", "(repeatable)"):
        assert shown in text, shown
    assert "default: none" not in text
    with pytest.raises(SystemExit):
        main(["formats", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "independent states sampled for the error (default: 2)" in text


def test_only_the_named_subcommand_gets_its_options():
    parser = build_parser(["formats"])
    assert parser.parse_args(["formats", "--states", "3"]).states == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["kl", "--tokens", "5"])  # kl's options were not built for a `formats` command line


@pytest.mark.parametrize("states", ["0", "-1"])
def test_formats_states_below_one(capsys, states):
    assert main(["formats", "--states", states]) == 2
    assert f"--states {states} is out of range; accepted: an integer >= 1" in _one_line_error(capsys, "formats")


def test_regress_only_matching_nothing_fails(capsys):
    assert main(["regress", "--only", "zzz/*"]) == 2
    err = _one_line_error(capsys, "regress")
    assert ("--only 'zzz/*' matches no metric of --part format,bits,kernel,chunked,kl,stats; known, e.g.: bits/bf16, "
            "chunked/gdn/*, format/bf16/*, kernel/encode/*, kl/buckets/*, stats/accuracy/*") in err


def test_regress_corrupt_baseline_names_the_file(tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    baseline.write_text('{"schema_version": 1, "metrics": {')
    assert main(["regress", "--baseline", str(baseline), "--part", "bits"]) == 2
    assert f"baseline {baseline} is not valid JSON" in _one_line_error(capsys, "regress")


def test_accuracy_without_lm_eval_says_how_to_install(capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    assert main(["accuracy", "--data", "fixtures", "--limit", "1"]) == 2
    assert 'pip install -e ".[eval]"' in _one_line_error(capsys, "accuracy")


def test_report_on_corrupt_kl_json_names_the_file(tmp_path, capsys):
    run = tmp_path / "kl-run"
    run.mkdir()
    (run / "kl.json").write_text(json.dumps({"model": "m"})[:-3])
    assert main(["report", str(run), "--output", str(tmp_path / "report")]) == 2
    assert f"{run / 'kl.json'}: not valid JSON" in _one_line_error(capsys, "report")
    assert not (tmp_path / "report").exists()

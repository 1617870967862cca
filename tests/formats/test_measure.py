"""The `formats` subcommand and the measuring function behind it."""

import json

import pytest

from replayssm_eval.cli import main
from replayssm_eval.formats.measure import format_error_table


def test_format_error_table():
    rows = format_error_table(["fp16", "nvfp4:scale=tensor"], (4, 16, 32), distribution="laplace", seed=1)
    assert [r["format"] for r in rows] == ["fp16", "nvfp4:scale=tensor"]
    assert rows[0]["state_bytes"] == 4 * 16 * 32 * 2 and rows[1]["bits_per_element"] == 4.5
    assert rows[0]["sqnr_db"] > 70 > rows[1]["sqnr_db"] > 15
    assert rows[1]["rel_rms_error"] == pytest.approx(10 ** (-rows[1]["sqnr_db"] / 20))


def test_cli_json(capsys):
    assert main(["formats", "--geometry", "2,16,32", "--distribution", "ssm", "--formats", "fp8sr",
                 "--formats", "mxfp4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["shape"] == [2, 16, 32] and [r["format"] for r in out["formats"]] == ["fp8sr", "mxfp4"]


def test_cli_table_and_errors(capsys):
    assert main(["formats", "--geometry", "2,8,16", "--states", "1"]) == 0
    out = capsys.readouterr().out
    assert "nvfp4" in out and "sqnr_db" in out
    assert main(["formats", "--formats", "nvfp5"]) == 2
    assert "unknown state format 'nvfp5'" in capsys.readouterr().err

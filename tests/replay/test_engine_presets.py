"""Engine presets: every preset parses, its expansion round-trips, unknown names list the known ones."""

import json

import pytest

from replayssm_eval.cli import main
from replayssm_eval.formats import get_format
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.engine_presets import ENGINES, PRESETS


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parses_and_round_trips(name):
    cfg = ReplayConfig.parse(name)
    assert cfg == ReplayConfig.parse(PRESETS[name].expansion)
    assert ReplayConfig.parse(cfg.name) == cfg
    assert ReplayConfig.parse(f"{name}#seed=5") == cfg.replace(seed=5)


def test_engine_names_do_not_clash():
    for engine in ENGINES:
        assert engine != "shared"
        with pytest.raises(ValueError):
            get_format(engine)
    assert ReplayConfig.parse("shared:fp16sr").name == "shared:fp16sr"


def test_unknown_preset_lists_known():
    with pytest.raises(ValueError, match="unknown engine preset 'vllm:fp4'; known: vllm:fp16sr, vllm:fp8"):
        ReplayConfig.parse("vllm:fp4")


def test_formats_presets_lists_expansions(capsys):
    assert main(["formats", "--presets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["presets"]
    assert [r["preset"] for r in rows] == list(PRESETS)
    assert rows[0]["expansion"] == ReplayConfig.parse(PRESETS[rows[0]["preset"]].expansion).name
    assert all(r["source"] for r in rows)
    assert main(["formats", "--presets"]) == 0
    assert "| vllm:replay-fp16sr | `shared:fp16sr:words=pair#buf=bf16` |" in capsys.readouterr().out

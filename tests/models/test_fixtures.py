"""The bundled tiny trained models: resolution, size, offline loading, recorded bits/byte and decay."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from replayssm_eval.data.bundled import load_bundled_text
from replayssm_eval.models import fixtures
from replayssm_eval.models.fixtures import BUNDLED_MODELS, FIXTURES_DIR, resolve_model

MAX_BYTES = 8_000_000
EXPECTED_CLASSES = {"tiny-nemotron-h": "NemotronHForCausalLM", "tiny-qwen3.5": "Qwen3_5ForCausalLM",
                    "tiny-kimi-linear": "KimiLinearForCausalLM"}
# held-out bits per byte each fixture must beat
MAX_BITS_PER_BYTE = {"tiny-nemotron-h": 2.5, "tiny-qwen3.5": 2.5, "tiny-kimi-linear": 2.5}


def test_resolve_model(tmp_path, monkeypatch):
    assert resolve_model("tiny-qwen3.5") == str(FIXTURES_DIR / "tiny-qwen3.5")
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(tmp_path) == str(tmp_path)
    monkeypatch.setattr(fixtures, "_hub_unavailable", lambda: None)  # a reachable hub: the id goes on unchanged
    assert resolve_model("Qwen/Qwen3.5-4B") == "Qwen/Qwen3.5-4B"
    assert set(BUNDLED_MODELS) == set(EXPECTED_CLASSES)


def test_resolve_model_fails_at_once(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="is a directory without config.json"):
        resolve_model(tmp_path)
    with pytest.raises(ValueError, match="is not a model directory"):
        resolve_model(tmp_path / "missing")
    monkeypatch.setattr(fixtures, "_hub_unavailable", lambda: "HF_HUB_OFFLINE is set")
    with pytest.raises(ValueError, match="not a bundled fixture, a local directory or in the local hub cache, and "
                                         "HF_HUB_OFFLINE is set; accepted: a bundled fixture .tiny-nemotron-h"):
        resolve_model("someone/no-such-model")
    with pytest.raises(ValueError, match="is not a valid hub id"):
        resolve_model("no such model")


@pytest.mark.parametrize("name", BUNDLED_MODELS)
def test_size_and_files(name):
    folder = FIXTURES_DIR / name
    for file in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "training.json"):
        assert (folder / file).is_file(), f"{name} lacks {file}"
    assert (folder / "model.safetensors").stat().st_size <= MAX_BYTES


@pytest.fixture(scope="module", params=BUNDLED_MODELS)
def bundled(request):
    """(name, model loaded by name in fp32, tokenizer loaded by path, training record)"""
    name = request.param
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        model = AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(FIXTURES_DIR / name)
    record = json.loads((FIXTURES_DIR / name / "training.json").read_text())
    return name, model.eval(), tokenizer, record


def test_loads_by_name_and_path(bundled):
    name, model, _, _ = bundled
    assert type(model).__name__ == EXPECTED_CLASSES[name]
    by_path = AutoModelForCausalLM.from_pretrained(str(FIXTURES_DIR / name), dtype=torch.float32)
    for (key, a), b in zip(model.state_dict().items(), by_path.state_dict().values()):
        assert torch.equal(a, b), key


@pytest.mark.slow
def test_bits_per_byte_matches_training_record(bundled):
    name, model, tokenizer, record = bundled
    text = load_bundled_text().encode("utf-8")[: record["check_bytes"]].decode("utf-8")
    ids = torch.tensor([tokenizer.encode(text)])  # [1, T]
    assert ids.shape[1] == record["check_bytes"]
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()  # [1, T, V]
    loss = F.cross_entropy(logits[0, :-1], ids[0, 1:])
    assert loss.item() / math.log(2) == pytest.approx(record["check_bits_per_byte"], abs=0.01)
    assert record["held_out_bits_per_byte"] < MAX_BITS_PER_BYTE[name]


def test_static_decay_matches_training_record(bundled):
    _, model, _, record = bundled
    decays = []  # per head (Mamba-2, GDN) or per head and channel (KDA: A_log [1, 1, H, 1], dt_bias [H * K])
    for mixer in (m for m in model.modules() if hasattr(m, "A_log")):
        dt = F.softplus(mixer.dt_bias.float().reshape(-1))
        if hasattr(mixer, "time_step_limit"):  # Mamba-2 clamps dt
            dt = dt.clamp(*mixer.time_step_limit)
        rate = torch.exp(mixer.A_log.float().reshape(-1)).repeat_interleave(dt.numel() // mixer.A_log.numel())
        decays.append(torch.exp(-rate * dt))
    decays = torch.cat(decays)
    table = record["decay_static"]
    assert decays.numel() == table["heads"]
    assert int((decays > 0.99).sum()) == table["above_0.99"]
    assert int((decays > 0.999).sum()) == table["above_0.999"]
    assert table["above_0.999"] > 0, "no long-memory heads"

"""The byte-level tokenizer: exact round trips, ids = bytes, offline loading, bundled copies."""

import json

import pytest
from transformers import AutoTokenizer

from replayssm_eval.models.fixtures import BUNDLED_MODELS, FIXTURES_DIR
from replayssm_eval.models.tokenizer import (
    EOS_TOKEN,
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    VOCAB_SIZE,
    build_byte_tokenizer,
    save_byte_tokenizer,
)

TEXTS = [
    "",
    "To be, or not to be: that is the question.\n",
    "naïve café — Ωμέγα, 日本語, 🎭🗡️",
    "\x00\x01\x7f\t\r\n  two  spaces ",
    "\ud7ff\ue000\U0010ffff",
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_utf8_bytes_and_round_trip(tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_special_tokens(tokenizer):
    assert len(tokenizer) == VOCAB_SIZE == 258
    assert tokenizer.eos_token == tokenizer.bos_token == EOS_TOKEN
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (EOS_TOKEN_ID, PAD_TOKEN_ID) == (256, 257)
    assert tokenizer.encode("a" + EOS_TOKEN) == [ord("a"), EOS_TOKEN_ID]
    assert tokenizer.decode([ord("a"), EOS_TOKEN_ID], skip_special_tokens=True) == "a"


def test_saved_tokenizer_loads_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    save_byte_tokenizer(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert loaded.decode(loaded.encode(text)) == text
    assert loaded.eos_token_id == EOS_TOKEN_ID


@pytest.mark.parametrize("name", BUNDLED_MODELS)
def test_bundled_tokenizer_matches_code(tmp_path, name):
    save_byte_tokenizer(tmp_path)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        expected = json.loads((tmp_path / file).read_text())
        assert json.loads((FIXTURES_DIR / name / file).read_text()) == expected, f"{name}/{file} is stale"

"""The static decode steps equal the eager Triton step bit for bit on the bundled tiny models.

- step="static" (per-layer static SSM step, Hugging Face's dynamic cache) against step="triton".
- step="graph"'s whole-model `StaticDecoder` (HF's StaticCache, our attention mask, static SSM step), run eagerly
  as off CUDA, against the Triton step session on a StaticCache fed through `ReplayModel.forward`: the same
  attention computation, so tokens, logits and every SSM layer's carried state (both stored copies, the packed
  read copy, the ring buffer, window phases, checkpoint indices) must be equal.
- greedy_generate(step="graph") against step="triton" (dynamic cache): the same tokens.

Prompts of different lengths (left padding), windows of 2 so a few tokens cross flushes. The Triton interpreter on
CPU is slow: few tokens, few configs here; tests/kernels/test_static_step.py covers every config kind per family.
"""

import functools
import os

import pytest
import torch
from transformers import StaticCache

from replayssm_eval.models import load_model
from replayssm_eval.models.model_graph import StaticDecoder
from replayssm_eval.models.session import ReplaySession
from replayssm_eval.tasks.generation import decode_session, greedy_generate, left_pad, sequence_id

DEVICE = os.environ.get("REPLAYSSM_TEST_DEVICE", "cpu")
PROMPTS = ("ROMEO:\nBut soft, what light", "To be")
NEW_TOKENS = 3


@functools.cache
def model(name):
    return load_model(name, dtype="fp32", device=DEVICE, backend="triton")


def prompt_batch(rm):
    prompts = [rm.tokenizer.encode(t) for t in PROMPTS]
    ids, mask = left_pad(prompts, rm.tokenizer.pad_token_id or 0, rm.model.device)
    return ids, mask, [sequence_id(p) for p in prompts]


def feed(rm, session, ids, mask):
    """(tokens [B, NEW_TOKENS], last logits [B, V]) of a greedy run of `session` through ReplayModel.forward."""
    with torch.no_grad():
        logits = rm.forward(ids, session, attention_mask=mask, logits_to_keep=1)[:, -1]
        tokens = []
        for _ in range(NEW_TOKENS):
            tokens.append(logits.argmax(-1))
            logits = rm.forward(tokens[-1][:, None], session, logits_to_keep=1)[:, -1]
    return torch.stack(tokens, 1), logits


def assert_same_states(ours: dict, eager: dict):
    assert ours.keys() == eager.keys() and eager
    for layer, b in eager.items():
        a = ours[layer]
        assert torch.equal(a.hi, b.hi) and torch.equal(a.lo, b.lo), layer
        assert torch.equal(a.checkpoint, b.checkpoint) and torch.equal(a.schedule.count, b.schedule.count), layer
        assert a.buffer.keys() == b.buffer.keys()
        for name in a.buffer:
            assert torch.equal(a.buffer[name], b.buffer[name]), (layer, name)
        for name in ("data", "scales", "global_scale"):
            x, y = getattr(a.lo_packed, name), getattr(b.lo_packed, name)
            assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), (layer, name)


@pytest.mark.parametrize("name,config", [("tiny-qwen3.5", "nvfp4/fp16sr@2"), ("tiny-nemotron-h", "shared:fp8sr@2")])
def test_static_step_equals_the_triton_step(name, config):
    rm = model(name)
    ids, mask, seq_ids = prompt_batch(rm)
    eager = decode_session(rm, config, seq_ids, "triton")
    static = decode_session(rm, config, seq_ids, "static")
    tokens, logits = feed(rm, eager, ids, mask)
    static_tokens, static_logits = feed(rm, static, ids, mask)
    assert torch.equal(static_tokens, tokens) and torch.equal(static_logits, logits)
    assert_same_states(static.states, eager.states)
    assert int(next(iter(eager.states.values())).checkpoint.max()) == NEW_TOKENS // 2


@pytest.mark.parametrize("name,config", [
    ("tiny-qwen3.5", "shared:nvfp4@2"), ("tiny-qwen3.5", "nvfp4/fp8sr@2"),
    ("tiny-nemotron-h", "nvfp4/fp16sr@2"), ("tiny-nemotron-h", "fp32"),
])
def test_whole_model_step_equals_the_triton_step_on_a_static_cache(name, config):
    rm = model(name)
    ids, mask, seq_ids = prompt_batch(rm)
    max_len = ids.shape[1] + NEW_TOKENS
    decoder = StaticDecoder(rm, config, ids, mask, seq_ids, max_len=max_len)
    with torch.no_grad():
        logits, tokens = decoder.prefill(), []
        for _ in range(NEW_TOKENS):
            tokens.append(logits.argmax(-1))
            logits = decoder.step(tokens[-1])
    text_config = rm.model.config.get_text_config(decoder=True)
    eager = ReplaySession(config, seq_ids=seq_ids, engine="step", backend="triton",
                          new_cache=lambda: StaticCache(config=text_config, max_cache_len=max_len))
    eager_tokens, eager_logits = feed(rm, eager, ids, mask)
    assert torch.equal(torch.stack(tokens, 1), eager_tokens) and torch.equal(logits, eager_logits)
    assert_same_states(decoder.session.states, eager.states)


def test_graph_step_generates_the_triton_step_tokens():
    rm = model("tiny-qwen3.5")
    prompts = [rm.tokenizer.encode(t) for t in PROMPTS]
    graph = greedy_generate(rm, prompts, config="nvfp4/fp16sr@2", max_gen_toks=NEW_TOKENS, step="graph")
    triton = greedy_generate(rm, prompts, config="nvfp4/fp16sr@2", max_gen_toks=NEW_TOKENS, step="triton")
    assert [g.tokens for g in graph] == [g.tokens for g in triton]


@pytest.mark.parametrize("step", ["static", "graph"])
def test_speculative_config_is_refused(step):
    rm = model("tiny-qwen3.5")
    with pytest.raises(ValueError, match="fixed windows only"):
        greedy_generate(rm, [[1, 2, 3]], config="nvfp4/fp16sr#spec=4:0.5", max_gen_toks=2, step=step)

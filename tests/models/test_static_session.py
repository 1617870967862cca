"""The static decode steps equal the eager Triton step bit for bit on the bundled tiny models.

- step="static" (per-layer static SSM step, Hugging Face's dynamic cache) against step="triton".
- step="graph"'s whole-model `StaticDecoder` (HF's StaticCache, our attention mask, static SSM step), run eagerly
  as off CUDA, against the Triton step session on a StaticCache fed through `ReplayModel.forward`: the same
  attention computation, so tokens, logits and every SSM layer's carried state (both stored copies, the packed
  read copy, the ring buffer, window phases, checkpoint indices) must be equal.
- a decoder continuing carried rows (`StaticDecoder.from_session`, the continuous-batching engine's regroup): rows
  of a running decoder (`rows`) joined with new rows after their prompt and first eager Triton step; the kept rows'
  states equal the old decoder's bit for bit, and the new decoder's steps equal the eager Triton step session on a
  copy of its StaticCache: tokens, logits and every SSM layer's carried state.
- greedy_generate(step="graph") against step="triton" (dynamic cache): the same tokens.

Prompts of different lengths (left padding), windows of 2 so a few tokens cross flushes; one config round-trips
the state at the prompt's end (a prefix-cache hit), which the fixed-buffer steps take before the state enters their
buffers; round trips inside the decode are refused. The Triton interpreter on CPU is slow: few tokens, few configs
here; tests/kernels/test_static_step.py covers every config kind per family.
"""

import copy

import pytest
import torch
from transformers import StaticCache

from replayssm_eval.generate.batch_rows import join
from replayssm_eval.generate.decode import decode_session, left_pad, sequence_id
from replayssm_eval.generate.generation import greedy_generate
from replayssm_eval.models.model_graph import StaticDecoder
from replayssm_eval.models.session import ReplaySession

from tests.helpers.generation import tiny_model

PROMPTS = ("ROMEO:\nBut soft, what light", "To be")
NEW_TOKENS = 3


def prompt_batch(rm, texts=PROMPTS):
    prompts = [rm.tokenizer.encode(t) for t in texts]
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


def assert_same_states(ours: dict, eager: dict, rows=None):
    """Every SSM layer's carried state of `ours` equals `eager`'s (its rows `rows`, when given) bit for bit."""
    assert ours.keys() == eager.keys() and eager
    pick = (lambda t: t) if rows is None else (lambda t: t[rows])  # noqa: E731
    for layer, b in eager.items():
        a = ours[layer]
        assert torch.equal(a.hi, pick(b.hi)) and torch.equal(a.lo, pick(b.lo)), layer
        assert torch.equal(a.checkpoint, pick(b.checkpoint)), layer
        assert torch.equal(a.schedule.count, pick(b.schedule.count)) and torch.equal(a.seq_ids, pick(b.seq_ids)), layer
        assert a.buffer.keys() == b.buffer.keys()
        for name in a.buffer:
            assert torch.equal(a.buffer[name], pick(b.buffer[name])), (layer, name)
        for name in ("data", "scales", "global_scale"):
            x, y = getattr(a.lo_packed, name), getattr(b.lo_packed, name)
            assert (x is None) == (y is None) and (x is None or torch.equal(x, pick(y))), (layer, name)


@pytest.mark.slow
@pytest.mark.parametrize("name,config", [("tiny-qwen3.5", "nvfp4/fp16sr@2"), ("tiny-nemotron-h", "shared:fp8sr@2"),
                                         ("tiny-kimi-linear", "nvfp4/fp8sr@2#closed")])
def test_static_step_equals_the_triton_step(name, config):
    rm = tiny_model(name, "triton")
    ids, mask, seq_ids = prompt_batch(rm)
    eager = decode_session(rm, config, seq_ids, "triton")
    static = decode_session(rm, config, seq_ids, "static")
    tokens, logits = feed(rm, eager, ids, mask)
    static_tokens, static_logits = feed(rm, static, ids, mask)
    assert torch.equal(static_tokens, tokens) and torch.equal(static_logits, logits)
    assert_same_states(static.states, eager.states)
    assert int(next(iter(eager.states.values())).checkpoint.max()) == NEW_TOKENS // 2


@pytest.mark.slow
@pytest.mark.parametrize("name,config", [
    ("tiny-qwen3.5", "shared:nvfp4@2"), ("tiny-qwen3.5", "nvfp4/fp8sr@2"),
    ("tiny-nemotron-h", "nvfp4/fp16sr@2"), ("tiny-nemotron-h", "fp32"),
    ("tiny-kimi-linear", "shared:fp8sr@2"),
    ("tiny-nemotron-h", "nvfp4/fp8sr@2#rt=int8:axis=headdim@prompt"),  # a prefix-cache hit: the anchor round-trips
    ("tiny-kimi-linear", "nvfp4/fp8sr@2#rt=fp8sr@every:3"),  # pages of 3 tokens: each row at its own positions
])
def test_whole_model_step_equals_the_triton_step_on_a_static_cache(name, config):
    rm = tiny_model(name, "triton")
    ids, mask, seq_ids = prompt_batch(rm)
    max_len = ids.shape[1] + NEW_TOKENS
    tokens, logits, states = decode_static(rm, config, ids, mask, seq_ids, max_len)
    eager = static_cache_session(rm, config, seq_ids, max_len)
    eager_tokens, eager_logits = feed(rm, eager, ids, mask)
    assert torch.equal(tokens, eager_tokens) and torch.equal(logits, eager_logits)
    assert_same_states(states, eager.states)


def decode_static(rm, config, ids, mask, seq_ids, max_len):
    """(tokens [B, NEW_TOKENS], last logits [B, V], SSM states) of a greedy `StaticDecoder` run, eagerly."""
    decoder = StaticDecoder(rm, config, ids, mask, seq_ids, max_len=max_len)
    with torch.no_grad():
        logits, tokens = decoder.prefill(), []
        for _ in range(NEW_TOKENS):
            tokens.append(logits.argmax(-1))
            logits = decoder.step(tokens[-1])
    return torch.stack(tokens, 1), logits, decoder.session.states


def static_cache_session(rm, config, seq_ids, max_len) -> ReplaySession:
    """The eager Triton step session on a Hugging Face StaticCache of max_len columns."""
    text_config = rm.model.config.get_text_config(decoder=True)
    return ReplaySession(config, seq_ids=seq_ids, engine="step", backend="triton",
                         new_cache=lambda: StaticCache(config=text_config, max_cache_len=max_len))


def first_step(rm, config, texts):
    """An eager Triton step session of `texts` after the prompt and one greedy token, and its next logits [B, V]."""
    ids, mask, seq_ids = prompt_batch(rm, texts)
    session = decode_session(rm, config, seq_ids, "triton")
    with torch.no_grad():
        logits = rm.forward(ids, session, attention_mask=mask, logits_to_keep=1)[:, -1]
        logits = rm.forward(logits.argmax(-1)[:, None], session, logits_to_keep=1)[:, -1]
    return session, logits


def greedy(step, logits, count):
    """(tokens [B, count], last logits [B, V]) of `count` greedy steps of `step` (token [B] -> logits [B, V])."""
    tokens = []
    with torch.no_grad():
        for _ in range(count):
            tokens.append(logits.argmax(-1))
            logits = step(tokens[-1])
    return torch.stack(tokens, 1), logits


@pytest.mark.slow
@pytest.mark.parametrize("name,config", [("tiny-nemotron-h", "nvfp4/fp16sr@2"), ("tiny-qwen3.5", "shared:fp8sr@2"),
                                         ("tiny-kimi-linear", "nvfp4/fp16sr@2"),
                                         ("tiny-nemotron-h", "nvfp4/fp16sr@2#rt=int8:axis=headdim@every:2")])
def test_regrouped_decoder_continues_its_rows_bit_for_bit(name, config):
    rm = tiny_model(name, "triton")
    first, logits = first_step(rm, config, PROMPTS)
    old = StaticDecoder.from_session(rm, first, steps=3)
    _, old_logits = greedy(old.step, logits, 2)
    kept = old.rows([1])  # row 0 leaves; row 1 is "To be", its KV columns trimmed to its own tokens
    assert kept.tokens == len(rm.tokenizer.encode(PROMPTS[1])) + 3
    assert_same_states(kept.states, old.session.states, rows=[1])
    new, new_logits = first_step(rm, config, ("KING HENRY:\nOnce more",))
    joined = join([kept, new])
    decoder = StaticDecoder.from_session(rm, joined, steps=4)
    eager = ReplaySession(config, seq_ids=joined.seq_ids, engine="step", backend="triton")
    cache = copy.deepcopy(decoder.session.carried()["cache"])  # the decoder's StaticCache, before any step
    eager.continue_from({"cache": cache, "states": copy.deepcopy(joined.states), "tokens": joined.tokens,
                         "attention_mask": joined.attention_mask})
    logits = torch.cat([old_logits[1:], new_logits])
    tokens, last = greedy(decoder.step, logits, 3)
    eager_tokens, eager_last = greedy(lambda t: rm.forward(t[:, None], eager, logits_to_keep=1)[:, -1], logits, 3)
    assert torch.equal(tokens, eager_tokens) and torch.equal(last, eager_last)
    assert_same_states(decoder.session.states, eager.states)
    assert decoder.max_len == joined.tokens + 4 and decoder.written == joined.tokens + 3


@pytest.mark.slow
def test_graph_step_generates_the_triton_step_tokens():
    rm = tiny_model("tiny-qwen3.5", "triton")
    prompts = [rm.tokenizer.encode(t) for t in PROMPTS]
    graph = greedy_generate(rm, prompts, config="nvfp4/fp16sr@2", max_gen_toks=NEW_TOKENS, step="graph")
    triton = greedy_generate(rm, prompts, config="nvfp4/fp16sr@2", max_gen_toks=NEW_TOKENS, step="triton")
    assert [g.tokens for g in graph] == [g.tokens for g in triton]


@pytest.mark.parametrize("step", ["static", "graph"])
def test_mixed_config_is_refused(step):
    rm = tiny_model("tiny-qwen3.5", "triton")
    with pytest.raises(ValueError, match=rf"^step '{step}' takes one config for every layer, got mixed config "
                                         r"'nvfp4/fp16sr#rt=int8@every:4\+1=fp32'; use step 'triton'$"):
        greedy_generate(rm, [[1, 2, 3]], config="nvfp4/fp16sr#rt=int8@every:4+1=fp32", max_gen_toks=2, step=step)


@pytest.mark.parametrize("step", ["static", "graph"])
def test_speculative_config_is_refused(step):
    rm = tiny_model("tiny-qwen3.5", "triton")
    with pytest.raises(ValueError, match="fixed windows only"):
        greedy_generate(rm, [[1, 2, 3]], config="nvfp4/fp16sr#spec=4:0.5", max_gen_toks=2, step=step)

"""The generation path is exact: fp32 ReplaySSM generations equal plain Hugging Face greedy `generate`.

Prompts of different lengths go through one left-padded batch (padding must never reach an SSM
state) and each is compared token for token with HF's own generate on that prompt alone. Then:
stop strings and eos, the Triton decode step against the step reference (in the Triton
interpreter on CPU), and continuation scoring against HF's full forward.
"""

import functools

import pytest
import torch
from transformers import AutoModelForCausalLM

from replayssm_eval.generate.generation import greedy_generate, score_continuations
from replayssm_eval.models import load_model
from replayssm_eval.models.fixtures import BUNDLED_MODELS, resolve_model

from tests.helpers.device import TEST_DEVICE

PROMPTS = ("ROMEO:\nBut soft, what light through yonder", "KING HENRY:\nOnce more unto the breach, dear friends", "To be")
NEW_TOKENS = 24
STEP = "triton" if TEST_DEVICE == "cuda" else "reference"  # the decode step the lm-eval model uses there


@functools.cache
def models(name: str):
    """(ReplayModel, the plain HF model) in fp32 on the test device; the plain one is never routed."""
    plain = AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=torch.float32).to(TEST_DEVICE).eval()
    return load_model(name, dtype="fp32", device=TEST_DEVICE, backend="triton" if STEP == "triton" else "torch"), plain


def encode(rm, texts=PROMPTS) -> list[list[int]]:
    return [rm.tokenizer.encode(t) for t in texts]


@pytest.mark.slow
@pytest.mark.parametrize("name", BUNDLED_MODELS)
def test_fp32_batched_generation_equals_hf_greedy_generate(name):
    rm, plain = models(name)
    prompts = encode(rm)
    gens = greedy_generate(rm, prompts, config="fp32", max_gen_toks=NEW_TOKENS, step=STEP)
    for prompt, gen in zip(prompts, gens):
        with torch.no_grad():
            out = plain.generate(torch.tensor([prompt], device=TEST_DEVICE), max_new_tokens=NEW_TOKENS, do_sample=False)
        assert list(gen.tokens) == out[0, len(prompt):].tolist()
        assert gen.gen_tokens == NEW_TOKENS and gen.hit_max_gen_toks and gen.max_gen_toks == NEW_TOKENS


def test_stop_strings_cut_the_text_and_count_the_tokens_up_to_the_stop():
    rm, _ = models("tiny-nemotron-h")
    free = greedy_generate(rm, encode(rm)[:1], config="fp32", max_gen_toks=NEW_TOKENS, step=STEP)[0]
    stop = free.text[10:13]
    first = free.text.index(stop)
    stopped = greedy_generate(rm, encode(rm)[:1], config="fp32", max_gen_toks=NEW_TOKENS, until=[stop], step=STEP)[0]
    assert stopped.text == free.text[:first] and not stopped.hit_max_gen_toks
    assert stopped.gen_tokens == first + len(stop)  # byte tokens: one per character here
    assert stopped.tokens == free.tokens[: stopped.gen_tokens]


@pytest.mark.parametrize("config,max_gen_toks", [
    ("nvfp4/fp16sr@2", 2),  # the lm-eval model's Triton step session on any device: a few tokens, the interpreter is slow
    pytest.param("nvfp4/fp16sr@4", NEW_TOKENS, marks=pytest.mark.skipif(
        TEST_DEVICE != "cuda", reason="the Triton interpreter takes minutes; run with REPLAYSSM_TEST_DEVICE=cuda")),
])
@pytest.mark.parametrize("name", [n if n == "tiny-qwen3.5" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in BUNDLED_MODELS])  # CI time: one family in the quick tier
def test_triton_decode_step_matches_the_step_reference(name, config, max_gen_toks):
    rm, _ = models(name)
    prompts = encode(rm, PROMPTS[:2])
    ref = greedy_generate(rm, prompts, config=config, max_gen_toks=max_gen_toks, step="reference")
    tri = greedy_generate(rm, prompts, config=config, max_gen_toks=max_gen_toks, step="triton")
    assert [g.tokens for g in tri] == [g.tokens for g in ref]


@pytest.mark.slow
@pytest.mark.parametrize("name", BUNDLED_MODELS)
def test_continuation_scores_equal_hf_full_forward_in_fp32_and_move_with_the_format(name):
    rm, plain = models(name)
    pairs = [(c, t) for c, t in zip(encode(rm), encode(rm, (" is the east", " ho", " or not to be, that is")))]
    ours = score_continuations(rm, pairs, config="fp32", backend=rm.backend)
    for (context, cont), (logprob, greedy) in zip(pairs, ours):
        with torch.no_grad():
            logits = plain(torch.tensor([context + cont], device=TEST_DEVICE)).logits[0, len(context) - 1 : -1]
        logits, cont = logits.log_softmax(-1).cpu(), torch.tensor(cont)
        want = float(logits.gather(-1, cont[:, None]).sum())
        assert abs(logprob - want) < 1e-3 * max(1.0, abs(want))
        assert greedy == bool((logits.argmax(-1) == cont).all())
    quantized = score_continuations(rm, pairs, config="shared:nvfp4@2", backend=rm.backend)
    assert any(abs(a[0] - b[0]) > 1e-4 for a, b in zip(ours, quantized))

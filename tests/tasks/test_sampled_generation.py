"""Sampled generation through the engine: common random numbers make the draws a function of the row's key alone.

Sample j of a prompt must come out token for token the same whatever the batching (one batch,
continuous batching with 4-token prefill segments and another entry order, an out-of-memory
restart), the decode step, and under a config that changes no logit; do_sample false and top_k 1
are the greedy path; the sample index and the sampling seed change the draws.
"""

import functools

import pytest

from replayssm_eval.generate.engine import Engine
from replayssm_eval.generate.sampling import Sampling

from tests.helpers.device import TEST_DEVICE
from tests.helpers.generation import out_of_memory_at_call, tiny_model

TEXTS = ("ROMEO:\nBut soft, what light", "To be", "HAMLET:\nAlas, poor Yorick")
ROWS = [(p, j) for p in range(len(TEXTS)) for j in range(2)]  # (prompt, sample): two samples of each prompt
LIMITS = [6, 3, 8, 4, 5, 7]
HOT = Sampling(1.0, 0.95, 40)  # hot enough that the draws leave the greedy path on the tiny models
STEP = "triton" if TEST_DEVICE == "cuda" else "reference"


def run(name="tiny-nemotron-h", config="fp32", sampling=HOT, seed=0, samples=None, limits=None, step=STEP, **engine):
    """Tokens of ROWS (sample j of prompt p) under `config` with `sampling`; engine keywords go to `Engine`."""
    rm = tiny_model(name)
    prompts = [rm.tokenizer.encode(TEXTS[p]) for p, _ in ROWS]
    engine = Engine(rm, config, step=step, max_batch=engine.pop("max_batch", len(ROWS)), sampling_seed=seed,
                    stop_at_eos=False, **engine)
    gens = engine.generate(prompts, max_gen_toks=limits or LIMITS, sampling=sampling,
                           samples=[j for _, j in ROWS] if samples is None else samples)
    return [g.tokens for g in gens]


@functools.cache
def reference_tokens(name="tiny-nemotron-h", config="fp32", seed=0):
    return run(name, config, seed=seed)


def test_same_seed_gives_the_same_samples_under_any_batching_and_entry_order():
    ref = reference_tokens()
    assert run(max_batch=2, prefill_segment=4, prefill_tokens=8, refill=1) == ref  # continuous batching, joins
    rm = tiny_model("tiny-nemotron-h")
    prompts = [rm.tokenizer.encode(TEXTS[p]) for p, _ in ROWS]
    gens = Engine(rm, "fp32", step=STEP, max_batch=3, prefill_segment=4, stop_at_eos=False).generate(
        prompts, max_gen_toks=LIMITS, sampling=HOT, samples=[j for _, j in ROWS], order=[5, 2, 0, 4, 1, 3])
    assert [g.tokens for g in gens] == ref
    greedy = run(sampling=Sampling())
    assert sum(a != b for a, b in zip(ref, greedy)) >= 4  # the draws left the greedy path
    assert [len(t) for t in ref] == LIMITS


def test_samples_of_one_prompt_differ_and_the_seed_changes_them():
    ref = reference_tokens()
    assert all(ref[2 * p] != ref[2 * p + 1] for p in range(len(TEXTS)))  # sample 0 vs sample 1 of each prompt
    other_seed = reference_tokens(seed=1)
    assert all(a != b for a, b in zip(ref, other_seed) if len(a) >= 5)


def test_a_config_that_changes_no_logit_gives_the_same_samples():
    # the SR seed of an FP32 state rounds nothing: every logit is the same, so every draw is
    assert reference_tokens(config="fp32#seed=3") == reference_tokens()


def test_do_sample_false_and_top_k_1_are_the_greedy_path():
    greedy = run(sampling=Sampling())
    assert run(sampling=Sampling.from_gen_kwargs({"do_sample": False, "temperature": 1.0, "top_k": 40})) == greedy
    assert run(sampling=Sampling(1.0, 1.0, 1)) == greedy
    assert run(sampling=Sampling(1.0, 1.0, 1), seed=7, samples=[3] * len(ROWS)) == greedy


def test_out_of_memory_restart_redraws_the_same_samples(monkeypatch):
    rm = tiny_model("tiny-nemotron-h")
    prompts = [rm.tokenizer.encode(TEXTS[p]) for p, _ in ROWS]
    engine = Engine(rm, "fp32", step=STEP, max_batch=4, prefill_segment=4, stop_at_eos=False)
    out_of_memory_at_call(monkeypatch, engine, 5)
    gens = engine.generate(prompts, max_gen_toks=LIMITS, sampling=HOT, samples=[j for _, j in ROWS])
    assert engine.max_batch == 2
    assert [g.tokens for g in gens] == reference_tokens()


@pytest.mark.slow  # CI time: the same-seed tests keep the Triton step's sampling in the quick tier
def test_sampled_triton_step_in_the_interpreter_draws_the_reference_steps_tokens():
    limits = [2, 1, 2, 1, 1, 2]
    ref = run("tiny-qwen3.5", "nvfp4/fp16sr@2", limits=limits, step="reference")
    assert run("tiny-qwen3.5", "nvfp4/fp16sr@2", limits=limits, step="triton", max_batch=3, refill=1) == ref


@pytest.mark.slow
def test_sampled_graph_step_draws_the_triton_steps_tokens():
    limits = [3, 1, 4, 2, 2, 3]
    triton = run("tiny-qwen3.5", "nvfp4/fp16sr@2", limits=limits, step="triton", max_batch=2, refill=1)
    assert run("tiny-qwen3.5", "nvfp4/fp16sr@2", limits=limits, step="graph", max_batch=2, refill=1) == triton

"""The loop detector on synthetic token ids at its thresholds, on ordinary text, and on tiny-model generations."""

import random
from pathlib import Path

import pytest

from replayssm_eval.accuracy import get_task
from replayssm_eval.generate.degeneration import MAX_SPAN, MIN_REPEATS, MIN_TAIL, is_loop, loop_span
from replayssm_eval.reports.load import Result
from replayssm_eval.reports.render import accuracy_markdown
from replayssm_eval.results.accuracy_tables import task_report


def distinct(n: int, seed: int = 0) -> list[int]:
    """n token ids with no repetition at all."""
    return random.Random(seed).sample(range(1000, 100000), n)


def repeated(span: list[int], copies: int, prefix: int = 50) -> list[int]:
    return distinct(prefix, seed=1) + span * copies


@pytest.mark.parametrize("p", [1, 2, 7, 16, 17, 50, MAX_SPAN])
def test_a_span_repeated_enough_times_at_the_end_is_a_loop_of_that_span(p):
    copies = max(MIN_REPEATS, -(-MIN_TAIL // p))
    assert loop_span(repeated(distinct(p, seed=p), copies)) == p
    assert loop_span(repeated(distinct(p, seed=p), copies + 5)) == p


@pytest.mark.parametrize("p", [1, 5, 16, 40])
def test_one_copy_short_of_the_thresholds_is_not_a_loop(p):
    copies = max(MIN_REPEATS, -(-MIN_TAIL // p))
    span = distinct(p, seed=p)
    tokens = repeated(span, copies)
    assert not is_loop(repeated(span, copies - 1))  # one copy fewer
    assert not is_loop(tokens + [7])  # the repetition stopped (e.g. the eos token)
    assert is_loop(span * copies)  # exactly n = max(R p, W) tokens, nothing before them


def test_spans_longer_than_the_maximum_and_ordinary_text_are_not_loops():
    assert not is_loop(repeated(distinct(MAX_SPAN + 1), 10))
    assert not is_loop(distinct(5000))
    text = ("ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun. "
            "Arise, fair sun, and kill the envious moon, who is already sick and pale with grief. ") * 1
    assert not is_loop(list(text.encode()))
    assert not is_loop(list(("| a | b |\n" * 5).encode()))  # a few equal table rows: under 64 tokens
    assert is_loop(list(("| a | b |\n" * 7).encode()))  # seven: a loop of a 10-token span


def test_degeneration_is_reported_per_bucket_for_fp32_and_each_config():
    spec = get_task("gpqa_diamond")
    # doc_id -> (correct, gen_tokens, hit_max_gen_toks, max_gen_toks, loop)
    fp32 = {0: (True, 10, False, 100, False), 1: (True, 20, False, 100, False), 2: (False, 90, False, 100, False),
            3: (True, 100, True, 100, True)}
    config = {0: (True, 100, True, 100, True), 1: (True, 30, False, 100, False), 2: (False, 100, True, 100, True),
              3: (False, 100, True, 100, True)}
    fp32, config = ({doc: [sample] for doc, sample in run.items()} for run in (fp32, config))  # one sample each
    task = task_report(spec, fp32, {"c": config}, "1,50", iters=10)
    low, high = task["buckets"]
    assert (low["n"], high["n"]) == (2, 2)
    assert low["fp32_mean_gen_tokens"] == 15 and low["fp32_loop_rate"] == 0 and low["fp32_truncated"] == 0
    assert low["configs"]["c"]["mean_gen_tokens"] == 65 and low["configs"]["c"]["loop_rate"] == 0.5
    assert high["fp32_loop_rate"] == 0.5 and high["configs"]["c"]["loop_rate"] == 1 and high["configs"]["c"]["truncated"] == 1
    assert task["all"]["configs"]["c"]["loop_rate"] == 0.75 and task["all"]["fp32_mean_gen_tokens"] == 55
    unrecorded = {k: [(*v[0][:4], None)] for k, v in config.items()}
    assert task_report(spec, fp32, {"c": unrecorded}, "1,50", iters=10)["all"]["configs"]["c"]["loop_rate"] is None
    report = {"model": "m", "complete": True, "configs": ["c"], "ci_method": "95% paired", "tasks": {
        "gpqa_diamond": {**task, "lm_eval_task": "t"}}}
    assert "| 1–49 | 2 | 15 / 0 / 0 | 65 / 50 / 50 |" in accuracy_markdown(Result("accuracy", Path("accuracy.json"), report, "run"))


@pytest.mark.slow
def test_a_tiny_model_shakespeare_generation_is_not_a_loop():
    """400 greedy tokens of tiny-nemotron-h: repetitive ("ROSALIND.\\nI will not be so ...") but no exact loop."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from replayssm_eval.models.fixtures import resolve_model

    path = resolve_model("tiny-nemotron-h")
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([tokenizer.encode("ROMEO:\nBut soft, what light through yonder")])
    with torch.no_grad():
        out = model.eval().generate(ids, max_new_tokens=400, do_sample=False)[0, ids.shape[1]:].tolist()
    assert len(out) == 400 and loop_span(out) is None

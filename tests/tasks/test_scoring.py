"""Scoring is right: an oracle scores 100% on every real task's fixtures, a fixed wrong letter 0%.

The oracle reads the answer from the processed document lm-eval hands it (`Instance.doc`) and
writes it the way the task's prompt asks for it; the scores come from the tasks' own filters and
metrics (lm-eval's regexes, math_verify), read exactly as the accuracy driver reads them.
"""

import pytest

pytest.importorskip("lm_eval")

from replayssm_eval.accuracy import DEFAULT_TASKS, TASKS
from replayssm_eval.accuracy.yaml.gpqa_diamond.utils import shuffled_choices

from tests.helpers.scoring import ScriptedLM, evaluate

ANSWERS = {  # task -> the answer text for the processed doc
    "gpqa_diamond": lambda doc: f"Let's see. The answer is {doc['answer']}.",
    "mmlu_pro": lambda doc: f"Thinking it through, the answer is ({doc['answer']}).",
    "math_l5": lambda doc: f"So it is ${doc['answer']}$.\nFinal Answer: The final answer is ${doc['answer']}$. I hope it is correct.",
}
WRONG = {  # a letter (or answer) no fixture question has as its answer
    "gpqa_diamond": "Let's see. The answer is {letter}.",
    "mmlu_pro": "Thinking it through, the answer is {letter}.",
    "math_l5": "Final Answer: The final answer is $B$. I hope it is correct.",
}


def accuracy(results, name: str) -> float:
    spec = TASKS[name]
    return results["results"][spec.local][f"{spec.metric},{spec.filter}"]


def correct_letters(results, name) -> set[str]:
    return {s["target"].strip("()") for s in results["samples"][TASKS[name].local]}


@pytest.mark.parametrize("name", DEFAULT_TASKS)  # the synthetic tasks: test_synthetic_scoring.py
def test_oracle_scores_everything_right_and_a_fixed_wrong_letter_nothing(task_manager, name):
    right = evaluate(ScriptedLM(ANSWERS[name]), task_manager, [TASKS[name].local])
    assert accuracy(right, name) == 1.0
    assert len(right["samples"][TASKS[name].local]) >= 5
    letters = correct_letters(right, name)
    letter = next(c for c in "ABCDEFGHIJ" if c not in letters)
    wrong = evaluate(ScriptedLM(lambda doc: WRONG[name].format(letter=f"({letter})")), task_manager, [TASKS[name].local])
    assert accuracy(wrong, name) == 0.0


def test_math_keeps_level_5_only(task_manager):
    results = evaluate(ScriptedLM(ANSWERS["math_l5"]), task_manager, [TASKS["math_l5"].local])
    assert len(results["samples"]["replayssm_math_l5_local"]) == 5  # the fixture's Level 1 problem is dropped


def test_multiple_choice_variant_scores_by_loglikelihood(task_manager):
    name = "replayssm_gpqa_diamond_mc_local"
    right = evaluate(ScriptedLM(None, choice=lambda doc: doc["answer"]), task_manager, [name])
    assert right["results"][name]["acc,none"] == 1.0
    wrong = evaluate(ScriptedLM(None, choice=lambda doc: "(E)"), task_manager, [name])
    assert wrong["results"][name]["acc,none"] < 1.0


def test_gpqa_choice_order_is_fixed_per_question():
    doc = {"Question": "Which?", "Correct Answer": "right", **{f"Incorrect Answer {i}": f"wrong {i}" for i in (1, 2, 3)}}
    first = shuffled_choices(doc)
    assert all(shuffled_choices(doc) == first for _ in range(3))
    assert first[0][first[1]] == "right"
    assert shuffled_choices(doc, seed=1) != first or shuffled_choices(doc, seed=2) != first  # the seed matters
    orders = {tuple(shuffled_choices({**doc, "Question": f"Which {i}?"})[0]) for i in range(20)}
    assert len(orders) > 1  # and the question: not one fixed permutation for all

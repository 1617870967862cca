"""The scoring fixtures on the synthetic tasks, CPU-sized: FP32 answers, an identical config changes nothing, the report renders."""

import json

import pytest

pytest.importorskip("lm_eval")

from replayssm_eval import cli
from replayssm_eval.accuracy.synthetic import SYNTHETIC_TASKS, generate, prompt_and_target, write_split
from replayssm_eval.models.fixtures import SCORING_MODELS

QUESTIONS = 4  # per task: the shortest test questions, so the CPU run stays short
# FP32 accuracy these questions reach at least: tiny-qwen3.5-solver names the right option of synth_swap only
# about as often as chance; the other solvers answer both tasks (reports/accuracy-solvers/README.md)
LEAST_ACCURACY = {"synth_sum": 0.5, "synth_swap": 1 / QUESTIONS}


def short_questions(tmp_path):
    """A data dir holding, per task, the QUESTIONS test rows (of the first 200) with the shortest gold targets."""
    for task in SYNTHETIC_TASKS:
        rows = sorted(generate(task, "test", 200), key=lambda row: len(prompt_and_target(task, row)[1]))[:QUESTIONS]
        path = write_split(task, "test", 0, 0, tmp_path)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("model", SCORING_MODELS)
def test_solver_scores_and_an_identical_config_changes_nothing(tmp_path, model):
    out = tmp_path / "run"
    data = short_questions(tmp_path / "data")
    assert cli.main(["accuracy", "--model", model, "--tasks", ",".join(SYNTHETIC_TASKS), "--data", str(data),
                     "--configs", "fp32,fp32#seed=3", "--max-gen-toks", "160", "--bootstrap-iters", "200",
                     "--max-batch-size", "6", "--output", str(out)]) == 0
    report = json.loads((out / "accuracy.json").read_text())
    for task in SYNTHETIC_TASKS:
        stats = report["tasks"][task]["all"]
        assert stats["n"] == report["tasks"][task]["n"] == QUESTIONS
        assert stats["fp32_acc"] >= LEAST_ACCURACY[task], (task, stats)
        same = stats["configs"]["fp32#seed=3"]
        assert same["acc"] == stats["fp32_acc"] and same["gap"] == 0
        assert same["flips_to_wrong"] == same["flips_to_right"] == 0
        texts = [[json.loads(line)["resps"] for line in (out / folder / f"samples_{task}.jsonl").open()]
                 for folder in ("fp32", "fp32#seed=3")]
        assert texts[0] == texts[1]
    assert cli.main(["report", str(out), "--output", str(tmp_path / "report")]) == 0
    html = (tmp_path / "report" / "report.html").read_text()
    assert all(task in html for task in SYNTHETIC_TASKS)

"""The synthetic tasks through lm-eval: the prompts it builds are the training prompts, the gold targets
score 1 and wrong answers 0 through the tasks' own filters and metrics, the data sources, the accuracy CLI."""

import json
import re

import pytest

pytest.importorskip("lm_eval")

from replayssm_eval import cli
from replayssm_eval.accuracy import FIXTURES_DIR, TASKS, YAML_DIR
from replayssm_eval.accuracy.driver import make_plan
from replayssm_eval.accuracy.options import AccuracyConfig
from replayssm_eval.accuracy.synthetic import SYNTHETIC_TASKS, generate, main, prompt_and_target

from tests.helpers.scoring import ScriptedLM, evaluate


def load(task: str, *, local: bool = True, **metadata):
    """The lm-eval task object of synthetic `task` (our YAMLs only), with this task metadata."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(YAML_DIR), include_defaults=False, metadata=metadata or None)
    name = TASKS[task].local if local else TASKS[task].hub
    return manager.load([name])["tasks"][name]


def score(task: str, answer, task_manager, **kwargs) -> tuple[float, list[dict]]:
    """(the task's accuracy as the accuracy driver reads it, lm-eval's samples) with `answer(doc)` as every generation."""
    spec = TASKS[task]
    results = evaluate(ScriptedLM(answer), task_manager, [spec.local], **kwargs)
    return results["results"][spec.local][f"{spec.metric},{spec.filter}"], results["samples"][spec.local]


def gold(task: str):
    return lambda doc: prompt_and_target(task, doc)[1]


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_lm_eval_prompts_are_the_training_prompts(task):
    lm_task = load(task)
    docs = list(lm_task.test_docs())
    assert docs == generate(task, "test", 500, seed=0)
    lm_task.build_all_requests(rank=0, world_size=1)
    assert len(lm_task.instances) == 500
    for inst in lm_task.instances:
        context, kwargs = inst.args
        assert context == prompt_and_target(task, docs[inst.doc_id])[0]  # zero-shot, no description
        assert kwargs == {"until": ["\n\n"], "do_sample": False, "temperature": 0.0, "max_gen_toks": 6144}


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_gold_targets_score_one(task, task_manager):
    accuracy, samples = score(task, gold(task), task_manager)
    assert accuracy == 1.0 and len(samples) == 500


def wrong_total(doc):
    """The gold solution with the boxed total off by one (mod 100)."""
    wrong = (int(doc["answer"]) + 1) % 100
    return re.sub(r"\\boxed\{\d+\}", lambda _: "\\boxed{%d}" % wrong, doc["solution"])


def wrong_item(doc):
    """The gold trace lines, then the answer lines naming another box's item and that item's letter."""
    letter = "ABCDEF"[(doc["answer_index"] + 1) % len(doc["options"])]
    item = doc["options"][(doc["answer_index"] + 1) % len(doc["options"])]
    head, _ = doc["cot_content"].rsplit("\nBox ", 1)
    box = re.search(r"box (\d) hold", doc["question"])[1]
    checks = "".join(f"({'ABCDEF'[k]}) {option} {item} {'yes' if option == item else 'no'}\n"
                     for k, option in enumerate(doc["options"][:doc["options"].index(item) + 1]))
    return f"{head}\nBox {box} holds {item}.\n{checks}The answer is ({letter})."


def wrong_letter(doc):
    """The gold chain and item, with the next letter."""
    letter = "ABCDEF"[(doc["answer_index"] + 1) % len(doc["options"])]
    return doc["cot_content"][:-3] + f"{letter})."


@pytest.mark.parametrize("task, answer", [("synth_sum", wrong_total), ("synth_swap", wrong_item),
                                          ("synth_swap", wrong_letter)])
def test_wrong_final_answers_score_zero(task, answer, task_manager):
    accuracy, samples = score(task, answer, task_manager, limit=150)
    assert accuracy == 0.0 and len(samples) == 150
    for sample in samples[:20]:  # the answers keep the gold trace lines and differ in their last line
        gold_lines, lines = gold(task)(sample["doc"]).split("\n"), sample["resps"][0][0].split("\n")
        trace = [line for line in gold_lines if re.match(r"\d{3}: ", line)]
        assert trace and lines[:len(trace)] == trace and gold_lines[-1] != lines[-1]


def test_swap_letter_is_extracted_with_or_without_parentheses(task_manager):
    accuracy, _ = score("synth_swap", lambda doc: f"The answer is {doc['answer']}.", task_manager, limit=20)
    assert accuracy == 1.0


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_hub_fixtures_and_metadata_give_the_generated_rows(task):
    rows = generate(task, "test", 500)
    assert list(load(task, local=False).test_docs()) == rows  # --data hub
    assert list(load(task, data_dir=str(FIXTURES_DIR)).test_docs()) == rows  # --data fixtures
    assert list(load(task, seed=7).test_docs()) == rows  # a model arg `seed` (lm-eval merges them in) is not ours
    assert list(load(task, synth_n=9, synth_seed=3).test_docs()) == generate(task, "test", 9, seed=3)


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_data_dir_reads_back_what_the_cli_wrote(task, tmp_path):
    assert main(["--task", task, "--n", "23", "--seed", "4", "--out", str(tmp_path)]) == 0
    rows = list(load(task, data_dir=str(tmp_path)).test_docs())
    assert rows == generate(task, "test", 23, seed=4) and rows != generate(task, "test", 23)


def test_accuracy_tasks_default_to_the_real_benchmarks_and_accept_the_synthetic_ones(tmp_path, capsys):
    assert AccuracyConfig().tasks == "gpqa_diamond,mmlu_pro,math_l5"
    plan = make_plan(AccuracyConfig(tasks="synth_sum,synth_swap", data="fixtures"))
    assert [plan.task_name(spec) for spec in plan.tasks] == ["replayssm_synth_sum_local", "replayssm_synth_swap_local"]
    (tmp_path / "data").mkdir()
    assert cli.main(["accuracy", "--tasks", "synth_swap", "--data", str(tmp_path / "data"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing dataset for task synth_swap" in err
    assert f"python -m replayssm_eval.accuracy.synthetic --task synth_swap --split test --out {tmp_path / 'data'}" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # about 25 s on a CPU core
def test_accuracy_runs_the_synthetic_tasks_on_the_cpu(tmp_path):
    out = tmp_path / "run"
    args = ["accuracy", "--model", "tiny-nemotron-h", "--tasks", "synth_sum,synth_swap", "--data", "fixtures",
            "--limit", "2", "--max-gen-toks", "8", "--configs", "fp32,nvfp4/fp16sr@4", "--bootstrap-iters", "200",
            "--output", str(out)]
    assert cli.main(args) == 0
    report = json.loads((out / "accuracy.json").read_text())
    assert set(report["tasks"]) == {"synth_sum", "synth_swap"}
    for name, task in report["tasks"].items():
        assert task["n"] == 2 and task["max_gen_toks"] == 8
        samples = [json.loads(line) for line in (out / "fp32" / f"samples_{name}.jsonl").open()]
        assert [s["doc"] for s in samples] == generate(name, "test", 2)
        assert all(1 <= s["gen_tokens"] <= 8 for s in samples)

"""The synthetic tasks' generator: deterministic, disjoint splits, answers re-derived from the prompt text alone.

No lm-eval needed here (the scoring through lm-eval is in test_synthetic_scoring.py).
"""

import json
import re
import statistics
import subprocess
import sys

import pytest

from replayssm_eval.accuracy.synthetic import SYNTHETIC_TASKS, generate, main, prompt_and_target
from replayssm_eval.data.sources import TextSource, iter_documents

SUM_PROMPT = re.compile(
    r"Problem: Start from 0 and add the numbers (?P<digits>\d(?:, \d)*) in turn, again from the first after the last, "
    r"for (?P<n>\d+) additions\. Keep only the last two digits of the total\. What is the final total\?\nSolution:\n")
SWAP_PROMPT = re.compile(
    r"Question: Boxes 1 to (?P<b>\d) hold: (?P<items>[a-z]{3}(?: [a-z]{3})*)\. Apply the swaps (?P<swaps>\d-\d(?:, \d-\d)*) "
    r"in turn, again from the first after the last, for (?P<n>\d+) swaps\. What does box (?P<q>\d) hold at the end\?\n"
    r"Options:\n(?P<options>(?:\([A-J]\) [a-z]{3}\n)+)Answer: Let's think step by step\.\n")


def solve_sum(prompt: str) -> tuple[list[str], str]:
    """(trace lines, final answer line) of a synth_sum prompt, from its text alone."""
    m = SUM_PROMPT.fullmatch(prompt)
    assert m, prompt
    digits = [int(d) for d in m["digits"].split(", ")]
    assert 3 <= len(digits) <= 6 and len(set(digits)) == len(digits) and 0 not in digits
    lines, total, n = [], 0, int(m["n"])
    for k in range(n):
        queue = digits[k % len(digits):] + digits[:k % len(digits)]
        d = queue[0]
        lines.append("%03d: %s %02d+%d=%02d\n" % (n - k - 1, "".join(map(str, queue)), total, d, (total + d) % 100))
        total = (total + d) % 100
    return lines, "The final total is $\\boxed{%d}$." % total


def solve_swap(prompt: str) -> tuple[list[str], str]:
    """(trace lines, final answer line) of a synth_swap prompt, from its text alone."""
    m = SWAP_PROMPT.fullmatch(prompt)
    assert m, prompt
    boxes = m["items"].split()
    assert len(boxes) == int(m["b"]) and 4 <= len(boxes) <= 6 and len(set(boxes)) == len(boxes)
    swaps = [tuple(map(int, s.split("-"))) for s in m["swaps"].split(", ")]
    assert 2 <= len(swaps) <= 4 and len({frozenset(s) for s in swaps}) == len(swaps)
    assert all(a != b and 1 <= a <= len(boxes) and 1 <= b <= len(boxes) for a, b in swaps)
    options = dict(re.findall(r"\(([A-J])\) ([a-z]{3})\n", m["options"]))
    assert list(options) == list("ABCDEF"[:len(boxes)]) and sorted(options.values()) == sorted(boxes)
    lines, n = [], int(m["n"])
    for k in range(n):
        queue = swaps[k % len(swaps):] + swaps[:k % len(swaps)]
        a, b = queue[0]
        boxes[a - 1], boxes[b - 1] = boxes[b - 1], boxes[a - 1]
        contents = " ".join("%d=%s" % (box, item) for box, item in enumerate(boxes, 1))
        lines.append("%03d: %s | %s\n" % (n - k - 1, " ".join("%d-%d" % s for s in queue), contents))
    item = boxes[int(m["q"]) - 1]
    letters = list(options)
    checks = []
    for letter in letters:
        checks.append(f"({letter}) {options[letter]} {item} {'yes' if options[letter] == item else 'no'}\n")
        if options[letter] == item:
            break
    return lines, f"Box {m['q']} holds {item}.\n{''.join(checks)}The answer is ({letter})."


SOLVERS = {"synth_sum": solve_sum, "synth_swap": solve_swap}


@pytest.fixture(scope="module")
def test_rows():
    return {task: generate(task, "test", 500) for task in SYNTHETIC_TASKS}


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_same_call_same_rows_and_the_seed_matters(task):
    rows = generate(task, "train", 40, seed=3)
    assert generate(task, "train", 40, seed=3) == rows
    assert generate(task, "train", 7, seed=3) == rows[:7]  # row i does not depend on n
    other = generate(task, "train", 40, seed=4)
    assert sum(a != b for a, b in zip(rows, other)) >= 35


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_train_and_test_share_no_prompt(task, test_rows):
    train = {prompt_and_target(task, row)[0] for row in generate(task, "train", 2000)}
    test = [prompt_and_target(task, row)[0] for row in test_rows[task]]
    assert len(train) > 1900 and len(set(test)) > 480  # the prompts themselves vary
    assert not train & set(test)
    # short questions are few (504 sums of N=2 over three digits): not even another seed's train split repeats one
    short = [row for row in generate(task, "train", 3000, seed=1) if row.get("level", row.get("src")) in ("N=1", "N=2")]
    assert len(short) > 100 and not {prompt_and_target(task, row)[0] for row in short} & set(test)


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
@pytest.mark.parametrize("split", ["train", "test"])
def test_target_is_the_simulation_of_the_prompt_text(task, split, test_rows):
    rows = test_rows[task] if split == "test" else generate(task, "train", 300, seed=11)
    for row in rows:
        prompt, target = prompt_and_target(task, row)
        lines, final = SOLVERS[task](prompt)
        assert target == "".join(lines) + final
        assert not target.endswith("\n") and "\n\n" not in target  # the YAMLs stop at "\n\n"
        if task == "synth_sum":
            assert row["solution"] == target and final == "The final total is $\\boxed{%s}$." % row["answer"]
            assert row["level"] == f"N={len(lines)}" and row["type"] == "synthetic running sum"
            assert row["answer"] == str(int(row["answer"]))  # no leading zero
        else:
            assert row["cot_content"] == target and final.endswith(f"The answer is ({row['answer']}).")
            assert row["options"][row["answer_index"]] == final.split()[3].rstrip(".")
            assert final.count(" yes\n") == 1 and final.count(" no\n") == row["answer_index"]
            assert "ABCDEFGHIJ"[row["answer_index"]] == row["answer"]
            assert row["src"] == f"N={len(lines)}" and row["category"] == "synthetic swaps"


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_difficulty_covers_short_and_long_targets(task, test_rows):
    sizes = [len(prompt_and_target(task, row)[1].encode()) for row in test_rows[task]]
    assert min(sizes) < 100 and max(sizes) >= 4096
    assert 200 < statistics.median(sizes) < 1500
    steps = [int(row.get("level", row.get("src"))[2:]) for row in test_rows[task]]
    lo, hi = (2, 220) if task == "synth_sum" else (1, 75)
    assert min(steps) == lo and hi - 10 < max(steps) <= hi
    # log-uniform: about as many rows below the geometric middle as above it
    middle = (lo * hi) ** 0.5
    assert 0.4 < sum(s < middle for s in steps) / len(steps) < 0.6


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match=r"unknown synthetic task 'synth_mul'; known: synth_sum, synth_swap"):
        generate("synth_mul", "test", 3)
    with pytest.raises(ValueError, match=r"unknown split 'validation'; accepted: train, test"):
        generate("synth_sum", "validation", 3)
    with pytest.raises(ValueError, match=r"n must be an integer >= 0, got -1"):
        generate("synth_swap", "test", -1)
    with pytest.raises(ValueError, match=r"unknown synthetic task 'math_l5'"):
        prompt_and_target("math_l5", {})


def test_cli_writes_the_split(tmp_path, capsys):
    assert main(["--task", "synth_swap", "--split", "train", "--n", "37", "--seed", "5", "--out", str(tmp_path)]) == 0
    path = tmp_path / "synth_swap" / "train.jsonl"
    assert capsys.readouterr().out.strip() == str(path)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows == generate("synth_swap", "train", 37, seed=5)
    assert [p.name for p in path.parent.iterdir()] == ["train.jsonl"]  # no temporary file left


def test_cli_writes_whole_questions_as_text_that_kl_reads(tmp_path):
    assert main(["--task", "synth_sum", "--n", "4", "--seed", "2", "--out", str(tmp_path), "--as-text"]) == 0
    path = tmp_path / "synth_sum" / "test.text.jsonl"
    documents = list(iter_documents(TextSource(data_files=(str(path),))))
    rows = generate("synth_sum", "test", 4, seed=2)
    assert [d.text for d in documents] == ["".join(prompt_and_target("synth_sum", row)) for row in rows]
    assert documents[3].text.endswith(f"$\\boxed{{{rows[3]['answer']}}}$.")


@pytest.mark.parametrize("args, message", [
    (["--task", "sum"], "unknown synthetic task 'sum'; known: synth_sum, synth_swap"),
    (["--task", "synth_sum", "--split", "dev"], "unknown split 'dev'; accepted: train, test"),
    (["--task", "synth_sum", "--n", "0"], "argument --n: '0' is not accepted; give a positive integer"),
    (["--task", "synth_sum", "--seed", "x"], "argument --seed: 'x' is not accepted; give an integer"),
    (["--task", "synth_sum", "--out", "FILE"], "--out 'FILE' is not a directory; accepted: a directory"),
])
def test_cli_errors_are_one_line(tmp_path, args, message):
    (tmp_path / "FILE").write_text("")
    args = [a.replace("FILE", str(tmp_path / "FILE")) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    result = subprocess.run([sys.executable, "-m", "replayssm_eval.accuracy.synthetic", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message.replace("FILE", str(tmp_path / "FILE")) in result.stderr
    assert not (tmp_path / "out").exists()


def test_importable_without_torch_or_lm_eval():
    code = ("import sys; import replayssm_eval.accuracy.synthetic as s; s.generate('synth_sum', 'test', 3); "
            "print(sorted(m for m in ('torch', 'lm_eval', 'datasets') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"

"""Synthetic task families that small byte-level models can learn: MATH-shaped sums, MMLU-Pro-shaped swaps.

    python -m replayssm_eval.accuracy.synthetic --task synth_sum --split test --n 500 --seed 0 --out DIR
        # writes DIR/synth_sum/test.jsonl (what `replayssm-eval accuracy --data DIR` reads)

Each question asks for the end of a long, simple computation; the gold continuation writes it out
one fixed-width trace line per step (`N` lines, the difficulty, drawn log-uniformly) and ends
with an answer line in the real benchmark's format, so the benchmark's own scorer reads it:

    synth_sum    running sum of a cycle of digits mod 100, answered `\\boxed{..}` (MATH-lighteval's schema;
                 scored like math_l5, by math_verify)
    synth_swap   a cycle of box swaps, asked which item a box ends with; the item is checked against the
                 options in turn, then answered "The answer is (X)."
                 (MMLU-Pro's schema; scored like mmlu_pro, by its "answer is (X)" regex)

Row i of (task, split, seed) is drawn from `random.Random(f"{task}:{split}:{seed}:{i}")` (a str seed
is hashed with sha512: the same on every run and platform), so the rows do not depend on `n`. The
splits come from disjoint streams, and a question also belongs to one split by its text: the
low bit of its sha256 (a draw of the other split's half is redrawn from the same stream). Short
questions are few (N=2 sums of three digits: 504), so disjoint streams alone would share some;
this way no train row of any seed repeats a test question. `prompt_and_target(task, row)` is exactly
what a model sees (the lm-eval task's doc_to_text) and the continuation it is trained on (no eos).
This module imports neither torch nor lm-eval; docs/synthetic_tasks.md describes the formats.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import tempfile
from pathlib import Path

SYNTHETIC_TASKS: tuple[str, ...] = ("synth_sum", "synth_swap")
SPLITS = ("train", "test")
LETTERS = "ABCDEFGHIJ"
ITEMS = ("ant", "bee", "cat", "dog", "elk", "fox", "gnu", "hen", "jay", "owl", "pig", "ram", "yak", "cow", "emu", "bat")
SUM_STEPS = (2, 220)  # bounds of the log-uniform number of additions
SWAP_STEPS = (1, 75)  # bounds of the log-uniform number of swaps


def generate(task: str, split: str, n: int, seed: int = 0) -> list[dict]:
    """Rows 0..n-1 of `task`'s `split` ("train" or "test") for `seed`, in the task's dataset schema.

    synth_sum:  problem, solution (the target), answer (the final total), level ("N=37"), type.
    synth_swap: question, options (the items, in the prompt's order), answer (letter), answer_index,
                cot_content (the target), category, src ("N=23").
    """
    check_task(task)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; accepted: {', '.join(SPLITS)}")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    draw, solve = (_sum_question, _sum_row) if task == "synth_sum" else (_swap_question, _swap_row)
    rows = []
    for i in range(n):
        rng = random.Random(f"{task}:{split}:{seed}:{i}")
        question = draw(rng)
        while not _in_split(question[0], split):
            question = draw(rng)
        rows.append(solve(*question))
    return rows


def prompt_and_target(task: str, row: dict) -> tuple[str, str]:
    """(the prompt exactly as the model sees it, the gold continuation: trace lines and the answer line, no eos)."""
    check_task(task)
    if task == "synth_sum":
        return f"Problem: {row['problem']}\nSolution:\n", row["solution"]
    options = "".join(f"({LETTERS[k]}) {item}\n" for k, item in enumerate(row["options"]))
    return f"Question: {row['question']}\nOptions:\n{options}Answer: Let's think step by step.\n", row["cot_content"]


def check_task(task: str) -> None:
    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; known: {', '.join(SYNTHETIC_TASKS)}")


def _in_split(question: str, split: str) -> bool:
    """Whether `question` belongs to `split`: the low bit of its sha256 (0: train, 1: test)."""
    return hashlib.sha256(question.encode()).digest()[0] % 2 == SPLITS.index(split)


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _sum_question(rng: random.Random) -> tuple[str, list[int], int]:
    """(problem text, the cycle of K distinct digits, N additions)."""
    digits = rng.sample(range(1, 10), rng.randint(3, 6))
    steps = _log_uniform(rng, *SUM_STEPS)
    problem = (f"Start from 0 and add the numbers {', '.join(map(str, digits))} in turn, again from the first after "
               f"the last, for {steps} additions. Keep only the last two digits of the total. What is the final total?")
    return problem, digits, steps


def _sum_row(problem: str, digits: list[int], steps: int) -> dict:
    """The row: add the digits in turn N times to a two-digit counter (mod 100), one trace line per addition.

    A line is `<additions left> : <the digits, the one added now first> <total>+<digit>=<new total>`: each line
    is the line before with its count down by one, its digits rotated by one and one addition.
    """
    lines, total = [], 0
    for k in range(1, steps + 1):
        queue = digits[(k - 1) % len(digits):] + digits[:(k - 1) % len(digits)]
        new = (total + queue[0]) % 100
        lines.append(f"{steps - k:03d}: {''.join(map(str, queue))} {total:02d}+{queue[0]}={new:02d}\n")
        total = new
    solution = "".join(lines) + f"The final total is $\\boxed{{{total}}}$."
    return {"problem": problem, "solution": solution, "answer": str(total), "level": f"N={steps}",
            "type": "synthetic running sum"}


def _swap_question(rng: random.Random) -> tuple[str, list[str], list[tuple[int, int]], int, int, list[str]]:
    """(question text, the B items in boxes 1..B, the S swaps as written, N swaps, the asked box, the options)."""
    boxes = rng.randint(4, 6)
    items = rng.sample(ITEMS, boxes)
    pairs = rng.sample([(i, j) for i in range(1, boxes + 1) for j in range(i + 1, boxes + 1)], rng.randint(2, 4))
    swaps = [(j, i) if rng.random() < 0.5 else (i, j) for i, j in pairs]
    steps = _log_uniform(rng, *SWAP_STEPS)
    asked = rng.randint(1, boxes)
    options = rng.sample(items, boxes)
    question = (f"Boxes 1 to {boxes} hold: {' '.join(items)}. Apply the swaps {', '.join(f'{i}-{j}' for i, j in swaps)} "
                f"in turn, again from the first after the last, for {steps} swaps. What does box {asked} hold at the end?")
    return question, items, swaps, steps, asked, options


def _swap_row(question: str, items: list[str], swaps: list[tuple[int, int]], steps: int, asked: int,
              options: list[str]) -> dict:
    """The row: apply the swaps in turn N times, one trace line per swap, then find the item among the options.

    A line is `<swaps left>: <the swaps, the one applied now first> | <box>=<item> ...` (the contents after the
    swap): each line is the line before with its count down by one, its swaps rotated by one and two items swapped.
    After `Box q holds <item>.`, one check line per option in the prompt's order, up to the match:
    `(<letter>) <option> <item> no|yes`, so the letter is read off the line that says yes.
    """
    lines, contents = [], list(items)
    for k in range(1, steps + 1):
        queue = swaps[(k - 1) % len(swaps):] + swaps[:(k - 1) % len(swaps)]
        i, j = queue[0]
        contents[i - 1], contents[j - 1] = contents[j - 1], contents[i - 1]
        written = " ".join(f"{a}-{b}" for a, b in queue)
        lines.append(f"{steps - k:03d}: {written} | {' '.join(f'{b}={x}' for b, x in enumerate(contents, 1))}\n")
    item = contents[asked - 1]
    index = options.index(item)
    checks = "".join(f"({LETTERS[k]}) {option} {item} {'yes' if k == index else 'no'}\n"
                     for k, option in enumerate(options[:index + 1]))
    target = "".join(lines) + f"Box {asked} holds {item}.\n{checks}The answer is ({LETTERS[index]})."
    return {"question": question, "options": options, "answer": LETTERS[index], "answer_index": index,
            "cot_content": target, "category": "synthetic swaps", "src": f"N={steps}"}


def write_split(task: str, split: str, n: int, seed: int, out: str | Path, as_text: bool = False) -> Path:
    """Write `generate(task, split, n, seed)` to `<out>/<task>/<split>.jsonl` atomically; returns the path.

    as_text: write each question whole instead (prompt and gold target, PG-19's schema: `short_book_title`,
    `text`) to `<out>/<task>/<split>.text.jsonl`, the text a teacher-forced `replayssm-eval kl` run reads.
    """
    rows = generate(task, split, n, seed)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is not a directory; accepted: a directory (created if missing)")
    path = out / task / (f"{split}.text.jsonl" if as_text else f"{split}.jsonl")
    if as_text:
        rows = [{"short_book_title": f"{task} {split} {seed} row {i}", "text": "".join(prompt_and_target(task, row))}
                for i, row in enumerate(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted; give a positive integer")
    return int(text)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted; give an integer") from None


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="python -m replayssm_eval.accuracy.synthetic",
                            description="write one split of a synthetic task as <out>/<task>/<split>.jsonl")
    parser.add_argument("--task", required=True, help=f"one of {', '.join(SYNTHETIC_TASKS)}")
    parser.add_argument("--split", default="test", help=f"one of {', '.join(SPLITS)} (default: test)")
    parser.add_argument("--n", type=_positive_int, default=500, help="number of rows (default: 500)")
    parser.add_argument("--seed", type=_int, default=0, help="generator seed (default: 0)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--as-text", action="store_true",
                        help="write whole questions (prompt + gold target) in PG-19's schema, for `kl --data-files`")
    args = parser.parse_args(argv)
    try:
        path = write_split(args.task, args.split, args.n, args.seed, args.out, as_text=args.as_text)
    except ValueError as err:
        parser.error(str(err))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

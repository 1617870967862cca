"""accuracy.json and accuracy.md of an accuracy run, rendered from its finished samples files.

Per task: the FP32 samples give each question's correctness and generation length, the buckets
(`buckets.make_buckets`) and the bucket of every question; each finished config is compared with
FP32 question by question (`stats.compare`) per bucket and over all questions. With n samples per
question (sampled runs), a question's correctness is the mean of its samples' (avg@n) and its FP32
length the mean of its FP32 samples' gen_tokens rounded to the nearest integer (halves up), so a
question and all its samples fall in one bucket; the shares (truncated, loops) and mean lengths are
over every (question, sample). Schema:
docs/accuracy_json_schema.md. The Markdown follows the paper's GPQA layout: FP32 accuracy, then
each config's change in points, one row per bucket; then each one's degeneration (mean generated
tokens, loop rate) in the same buckets.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from replayssm_eval.kl.output import finite
from replayssm_eval.kl.store import atomic_write_bytes, atomic_write_json
from replayssm_eval.tasks import TaskSpec
from replayssm_eval.tasks.buckets import bucket_index, make_buckets
from replayssm_eval.tasks.stats import BOOTSTRAP_SEED, CI_LEVEL, compare

SCHEMA_VERSION = 1
JSON_FILE, MARKDOWN_FILE = "accuracy.json", "accuracy.md"


def load_samples(folder: Path, spec: TaskSpec) -> dict[int, list[tuple[bool, int, bool, int, bool | None]]] | None:
    """doc_id -> [(correct, gen_tokens, hit_max_gen_toks, max_gen_toks, loop) of samples 0..n-1] of a finished
    (config, task); None if unfinished. `loop` (`degeneration.is_loop`) is None in samples written before it was
    recorded; a sample without a `sample` index (written before sampling) is sample 0."""
    if not (folder / f"results_{spec.name}.json").is_file():
        return None
    found: dict[int, dict[int, tuple]] = {}
    with open(folder / f"samples_{spec.name}.jsonl", encoding="utf-8") as f:
        for sample in map(json.loads, f):
            if sample["filter"] == spec.filter:
                found.setdefault(sample["doc_id"], {})[sample.get("sample", 0)] = (
                    bool(sample[spec.metric]), sample["gen_tokens"], sample["hit_max_gen_toks"], sample["max_gen_toks"],
                    sample.get("loop"))
    out = {doc: [by_index[j] for j in sorted(by_index)] for doc, by_index in found.items()}
    counts = {len(v) for v in out.values()}
    if any(sorted(v) != list(range(len(v))) for v in found.values()) or len(counts) > 1:
        raise ValueError(f"{folder / f'samples_{spec.name}.jsonl'}: questions do not all have samples 0..n-1")
    return out


def task_report(spec: TaskSpec, fp32: dict, configs: dict[str, dict], bucket_spec: str, iters: int) -> dict:
    """One task of accuracy.json from the FP32 samples and each finished config's samples (`load_samples`)."""
    ids = sorted(fp32)
    base, lengths, truncated, limits = _field(fp32, ids, 0), _field(fp32, ids, 1), _field(fp32, ids, 2), _field(fp32, ids, 3)
    loops = _loops(fp32, ids)  # each [Q, n]
    if len(set(limits.ravel().tolist())) != 1:
        raise ValueError(f"{spec.name}: the FP32 samples have several max_gen_toks: {sorted(set(limits.ravel().tolist()))}")
    max_gen_toks = int(limits[0, 0])
    others = {}
    for name, samples in configs.items():
        if sorted(samples) != ids:
            raise ValueError(f"{spec.name}: config {name} was scored on other questions than fp32")
        if len(samples[ids[0]]) != base.shape[1]:
            raise ValueError(f"{spec.name}: config {name} has {len(samples[ids[0]])} samples per question, fp32 {base.shape[1]}")
        if set(_field(samples, ids, 3).ravel().tolist()) != {max_gen_toks}:
            raise ValueError(f"{spec.name}: config {name} ran with another max_gen_toks than fp32 ({max_gen_toks})")
        others[name] = (_field(samples, ids, 0), _field(samples, ids, 2), _field(samples, ids, 1), _loops(samples, ids))
    question_lengths = np.floor(lengths.mean(1) + 0.5).astype(np.int64)  # [Q]

    def entry(mask: np.ndarray, start: int, end: int) -> dict:
        n = int(mask.sum())
        return {
            "start": start, "end": end, "n": n,
            "fp32_acc": float(base[mask].mean()) if n else None,
            "fp32_truncated": float(truncated[mask].mean()) if n else None,
            **{f"fp32_{k}": v for k, v in _degeneration(lengths, loops, mask).items()},
            "configs": {
                name: {**compare(base[mask], correct[mask], iters=iters), "truncated": float(hit[mask].mean()) if n else None,
                       **_degeneration(gen, loop, mask)}
                for name, (correct, hit, gen, loop) in others.items()
            },
        }

    buckets = make_buckets(bucket_spec, question_lengths, max_gen_toks)
    index = bucket_index(buckets, question_lengths)
    return {
        "metric": spec.metric,
        "filter": spec.filter,
        "max_gen_toks": max_gen_toks,
        "n": len(ids),
        "samples": int(base.shape[1]),
        "doc_ids": ids,
        "all": entry(np.ones(len(ids), dtype=bool), 1, max_gen_toks),
        "buckets": [entry(index == k, b.start, b.end) for k, b in enumerate(buckets)],
    }


def _field(samples: dict, ids: list[int], k: int) -> np.ndarray:
    """[Q, n] field k of every question's samples (`load_samples`)."""
    return np.array([[s[k] for s in samples[i]] for i in ids])


def _loops(samples: dict, ids: list[int]) -> np.ndarray | None:
    """[Q, n] bool loop flags, or None when any sample lacks one."""
    flags = _field(samples, ids, 4)
    return None if any(f is None for f in flags.ravel()) else flags.astype(bool)


def _degeneration(lengths: np.ndarray, loops: np.ndarray | None, mask: np.ndarray) -> dict:
    """mean_gen_tokens and loop_rate of the questions in `mask` (None for an empty bucket or unrecorded loops)."""
    n = int(mask.sum())
    return {"mean_gen_tokens": float(lengths[mask].mean()) if n else None,
            "loop_rate": float(loops[mask].mean()) if n and loops is not None else None}


def render(run_dir: Path, plan, header: dict) -> dict:
    """Write accuracy.json and accuracy.md from what is finished in `run_dir`; returns the report."""
    from replayssm_eval.tasks.accuracy import config_dir

    reference, *configs = plan.configs
    tasks, complete = {}, True
    for spec in plan.tasks:
        fp32 = load_samples(config_dir(run_dir, reference), spec)
        done = {c.name: load_samples(config_dir(run_dir, c), spec) for c in configs}
        complete &= fp32 is not None and all(s is not None for s in done.values())
        if fp32 is not None:
            finished = {name: s for name, s in done.items() if s is not None}
            tasks[spec.name] = {**header["task_settings"][spec.name],
                                **task_report(spec, fp32, finished, plan.options.buckets, plan.options.bootstrap_iters)}
    report = finite({
        "schema_version": SCHEMA_VERSION,
        "complete": complete,
        **{k: v for k, v in header.items() if k != "task_settings"},
        "reference": reference.name,
        "configs": [c.name for c in configs],
        "bucket_spec": plan.options.buckets,
        "ci_method": f"{CI_LEVEL:.0%} paired percentile bootstrap over questions, "
                     f"{plan.options.bootstrap_iters} resamples, seed {BOOTSTRAP_SEED}"
                     + ("" if plan.options.samples == 1 else f" (each question the mean of its {plan.options.samples} samples)"),
        "p_value_method": "exact two-sided McNemar (binomial test on the discordant questions)" if plan.options.samples == 1
                          else "exact two-sided paired sign-flip test on the per-question differences of correct samples",
        "tasks": tasks,
    })
    atomic_write_json(run_dir / JSON_FILE, report)
    atomic_write_bytes(run_dir / MARKDOWN_FILE, markdown(report).encode())
    return report


def markdown(report: dict) -> str:
    """The tables of accuracy.md: per task, FP32 accuracy and each config's change in points, per FP32 length bucket."""
    configs = report["configs"]
    lines = [f"# Accuracy vs FP32 state: {report['model']}", ""]
    if not report["complete"]:
        lines += ["**Incomplete run**: only finished (config, task) pairs are shown.", ""]
    sampling = report.get("sampling") or {"do_sample": False, "samples": 1}
    test = "McNemar" if sampling["samples"] == 1 else "sign-flip"
    if sampling["do_sample"]:
        lines += [f"Sampled: temperature {sampling['temperature']}, top_p {sampling['top_p']}, top_k {sampling['top_k']}, "
                  f"seed {sampling['seed']}, {sampling['samples']} samples per question; accuracy is avg@{sampling['samples']} "
                  "(the mean over questions of each question's mean over its samples); sample j of a question is drawn "
                  "with the same random numbers under every config.", ""]
    lines += [
        "Rows: buckets of FP32 generation length (tokens); accuracy in %; each config's change vs FP32 in points "
        f"with its {report['ci_method'].split(' paired')[0]} interval; `*` {test} p < 0.05. Last columns / table: share "
        "of answers truncated at max_gen_toks.", "",
    ]
    for name, task in report["tasks"].items():
        lines += [f"## {name}", "",
                  f"`{task['lm_eval_task']}`, {task['metric']} ({task['filter']}), max_gen_toks {task['max_gen_toks']}, "
                  f"{task['n']} questions", ""]
        shown = [c for c in configs if c in task["all"]["configs"]]
        lines.append("| FP32 gen tokens | n | FP32 acc | " + " | ".join(shown) + " | FP32 trunc | "
                     + " | ".join(f"{c} trunc" for c in shown) + " |")
        lines.append("|---|---:|---:|" + "---:|" * (2 * len(shown) + 1))
        for row in [*task["buckets"], task["all"]]:
            label = "all" if row is task["all"] else f"{row['start']}-{row['end']}"
            cells = [label, str(row["n"]), _pct(row["fp32_acc"])]
            cells += [_gap(row["configs"][c]) for c in shown]
            cells += [_pct(row["fp32_truncated"], 0)] + [_pct(row["configs"][c]["truncated"], 0) for c in shown]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Degeneration: mean generated tokens / share of loops in % (`degeneration.is_loop`), per FP32 length bucket.",
                  "", "| FP32 gen tokens | n | fp32 | " + " | ".join(shown) + " |", "|---|---:|---:|" + "---:|" * len(shown)]
        for row in [*task["buckets"], task["all"]]:
            label = "all" if row is task["all"] else f"{row['start']}-{row['end']}"
            cells = [label, str(row["n"]), _degenerate(row["fp32_mean_gen_tokens"], row["fp32_loop_rate"])]
            cells += [_degenerate(row["configs"][c]["mean_gen_tokens"], row["configs"][c]["loop_rate"]) for c in shown]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _degenerate(mean_tokens, loop_rate) -> str:
    return f"{'-' if mean_tokens is None else f'{mean_tokens:.0f}'} / {_pct(loop_rate, 0)}"


def _pct(value, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}"


def _gap(stats: dict) -> str:
    if stats["gap"] is None:
        return "-"
    star = "*" if stats["p_value"] is not None and stats["p_value"] < 0.05 else ""
    return f"{100 * stats['gap']:+.1f} [{100 * stats['ci_low']:+.1f}, {100 * stats['ci_high']:+.1f}]{star}"

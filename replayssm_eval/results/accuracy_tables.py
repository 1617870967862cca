"""The tables of accuracy.json (schema: docs/accuracy_json_schema.md), built from an accuracy run's finished
samples files (`accuracy_store`).

Per task: the FP32 samples give each question's correctness and generation length, the buckets
(`buckets.make_buckets`) and the bucket of every question; each finished config is compared with
FP32 question by question (`stats.compare`) per bucket and over all questions. With n samples per
question (sampled runs), a question's correctness is the mean of its samples' (avg@n) and its FP32
length the mean of its FP32 samples' gen_tokens rounded to the nearest integer (halves up), so a
question and all its samples fall in one bucket; the shares (truncated, loops) and mean lengths are
over every (question, sample).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from replayssm_eval.results.accuracy_store import config_dir, load_samples
from replayssm_eval.results.buckets import bucket_index, make_buckets
from replayssm_eval.results.provenance import finite
from replayssm_eval.results.stats import BOOTSTRAP_SEED, CI_LEVEL, compare

SCHEMA_VERSION = 1
JSON_FILE, MARKDOWN_FILE = "accuracy.json", "accuracy.md"


def task_report(spec, fp32: dict, configs: dict[str, dict], bucket_spec: str, iters: int) -> dict:
    """One task (`spec`, an `accuracy.TaskSpec`) of accuracy.json from the FP32 samples and each finished config's
    samples (`accuracy_store.load_samples`)."""
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


def accuracy_report(run_dir: Path, specs, configs, header: dict, *, bucket_spec: str, iters: int, samples: int) -> dict:
    """accuracy.json of what is finished in `run_dir`: `specs` (`accuracy.TaskSpec`s), `configs` (FP32 first), the
    run's `header` (provenance; `task_settings` per task), its bucket spec, bootstrap resamples and samples per question."""
    reference, *configs = configs
    tasks, complete = {}, True
    for spec in specs:
        fp32 = load_samples(config_dir(run_dir, reference), spec)
        done = {c.name: load_samples(config_dir(run_dir, c), spec) for c in configs}
        complete &= fp32 is not None and all(s is not None for s in done.values())
        if fp32 is not None:
            finished = {name: s for name, s in done.items() if s is not None}
            tasks[spec.name] = {**header["task_settings"][spec.name],
                                **task_report(spec, fp32, finished, bucket_spec, iters)}
    return finite({
        "schema_version": SCHEMA_VERSION,
        "complete": complete,
        **{k: v for k, v in header.items() if k != "task_settings"},
        "reference": reference.name,
        "configs": [c.name for c in configs],
        "bucket_spec": bucket_spec,
        "ci_method": f"{CI_LEVEL:.0%} paired percentile bootstrap over questions, {iters} resamples, seed {BOOTSTRAP_SEED}"
                     + ("" if samples == 1 else f" (each question the mean of its {samples} samples)"),
        "p_value_method": "exact two-sided McNemar (binomial test on the discordant questions)" if samples == 1
                          else "exact two-sided paired sign-flip test on the per-question differences of correct samples",
        "tasks": tasks,
    })

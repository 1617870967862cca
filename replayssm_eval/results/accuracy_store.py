"""The accuracy run directory: one folder per config, lm-eval's samples and results of each finished task.

    run.json                            the run's options (`accuracy.driver` checks them on a rerun)
    <config>/samples_<task>.jsonl       lm-eval's samples, plus sample, gen_tokens, hit_max_gen_toks, max_gen_toks, loop
    <config>/results_<task>.json        lm-eval's results for the task (written last: marks it finished)

`<config>` is the config's name with "/" written "+". Every file is written atomically (`files`).
"""

from __future__ import annotations

import json
from pathlib import Path

from replayssm_eval.results.files import atomic_write_bytes

RUN_FILE = "run.json"


def config_dir(run_dir: Path, config) -> Path:
    """The folder of a `ReplayConfig`'s results."""
    return run_dir / config.name.replace("/", "+")


def save_task(folder: Path, task: str, task_name: str, evaluations: list[tuple[dict, list[dict]]], run: dict) -> None:
    """samples_<task>.jsonl (every sample index, the generation records added), then results_<task>.json (lm-eval's
    results of sample 0, with `run` and each sample's `results` under `replayssm`).

    task_name: lm-eval's name of `task`; evaluations: (lm-eval's results, the generation records) of each sample index.
    """
    from lm_eval.utils import handle_non_serializable

    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for j, (results, records) in enumerate(evaluations):
        by_doc = {(r["task"], r["doc_id"]): r for r in records}
        for sample in results.pop("samples")[task_name]:
            record = by_doc[(task_name, sample["doc_id"])]
            sample["sample"] = j
            sample.update({k: record[k] for k in ("gen_tokens", "hit_max_gen_toks", "max_gen_toks")})
            sample["loop"] = record.get("loop")  # None in generations files written before loops were recorded
            lines.append(json.dumps(sample, default=handle_non_serializable, ensure_ascii=False) + "\n")
    atomic_write_bytes(folder / f"samples_{task}.jsonl", "".join(lines).encode())
    results = evaluations[0][0]
    results["replayssm"] = {**run, "sample_results": [r["results"] for r, _ in evaluations]}
    text = json.dumps(results, default=handle_non_serializable, indent=2, ensure_ascii=False) + "\n"
    atomic_write_bytes(folder / f"results_{task}.json", text.encode())


def load_samples(folder: Path, spec) -> dict[int, list[tuple[bool, int, bool, int, bool | None]]] | None:
    """doc_id -> [(correct, gen_tokens, hit_max_gen_toks, max_gen_toks, loop) of samples 0..n-1] of a finished
    (config, task) (`spec`: its `accuracy.TaskSpec`); None if unfinished. `loop` (`generate.degeneration.is_loop`)
    is None in samples written before it was recorded; a sample without a `sample` index (written before sampling)
    is sample 0."""
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

"""What the task YAMLs in `yaml/` build on: lm-eval's own task YAMLs, and local copies of the datasets.

`IncludedTask` (a YAML's `class:`) is lm-eval's `include:` by package path. lm-eval resolves an
`include:` relative to the including file or as an absolute path, and its task YAMLs live
wherever lm_eval is installed; so a YAML here names the file under `lm_eval/tasks/` in
`lm_eval_include:` and gets its keys, with its own keys on top (`!function` hooks of the
included file resolve next to it, as with `include:`). Nothing is copied.

`local_dataset` (a local variant's `custom_dataset:`) reads the files of a hub dataset in the
hub's own layout and schema from `<data_dir>/<folder>/`; `data_dir` comes from lm-eval's task
metadata (`--metadata '{"data_dir": "..."}'` on lm-eval's CLI, `--data DIR` on ours) and defaults
to the bundled offline fixtures.

`synthetic_dataset` (the synthetic tasks' `custom_dataset:`) generates their test rows
(`synthetic.generate`), or reads `<data_dir>/<task>/test.jsonl` as `python -m
replayssm_eval.accuracy.synthetic` writes it. The bundled fixtures of a synthetic task are its
generator: without a data_dir (`--data hub`) or with the fixtures' (`--data fixtures`) the rows
are generated, so both give the same 500 questions.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import lm_eval.tasks
from lm_eval.api.task import ConfigurableTask
from lm_eval.tasks._yaml_loader import load_yaml

from replayssm_eval.accuracy import FIXTURES_DIR
from replayssm_eval.accuracy.synthetic import generate

LM_EVAL_TASKS = Path(lm_eval.tasks.__file__).parent
_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


class IncludedTask(ConfigurableTask):
    """A task whose config is lm-eval's YAML `lm_eval_include` (relative to lm_eval/tasks) under this YAML's keys."""

    def __init__(self, config: dict):
        config = {k: v for k, v in config.items() if k != "class"}
        path = LM_EVAL_TASKS / config.pop("lm_eval_include")
        if not path.is_file():
            raise FileNotFoundError(f"lm-eval {lm_eval.__version__} has no task file {path}")
        base = load_yaml(path, resolve_func=True)
        for key in ("tag", "group", "task_list"):  # the included task's memberships are not ours
            base.pop(key, None)
        metadata = {**(base.get("metadata") or {}), **(config.get("metadata") or {})}
        super().__init__(config={**base, **config, "metadata": metadata})


def local_dataset(*, folder: str, files: str, split: str, data_dir: str | None = None, **_) -> datasets.DatasetDict:
    """{split: the rows of `<data_dir>/<folder>/<files>`} (a glob; .csv, .json, .jsonl or .parquet)."""
    root = Path(data_dir) if data_dir else FIXTURES_DIR
    paths = sorted(p for p in (root / folder).glob(files) if p.suffix in _BUILDERS)
    if not paths:
        raise FileNotFoundError(
            f"missing dataset: no {files} ({', '.join(_BUILDERS)}) in {root / folder}; "
            f"a local copy keeps the hub dataset's file layout under <data dir>/{folder}/"
        )
    suffixes = {_BUILDERS[p.suffix] for p in paths}
    if len(suffixes) > 1:
        raise ValueError(f"{root / folder}/{files} mixes file types: {', '.join(p.name for p in paths)}")
    rows = datasets.load_dataset(suffixes.pop(), data_files=[str(p) for p in paths], split="train")
    return datasets.DatasetDict({split: rows})


def synthetic_dataset(*, task: str, data_dir: str | None = None, synth_n: int = 500, synth_seed: int = 0,
                      **_) -> datasets.DatasetDict:
    """{"test": rows of synthetic `task`}: `generate(task, "test", synth_n, synth_seed)` without a data_dir or
    with the bundled fixtures' one, else the rows of `<data_dir>/<task>/test.jsonl` (synth_n, synth_seed unused).

    synth_n and synth_seed come from lm-eval's task metadata (`--metadata '{"synth_n": 1000}'`); lm-eval merges
    the model args into it too, hence not a bare `seed` (the model's SR seed).
    """
    if data_dir is None or Path(data_dir).resolve() == FIXTURES_DIR.resolve():
        return datasets.DatasetDict({"test": datasets.Dataset.from_list(generate(task, "test", int(synth_n), int(synth_seed)))})
    path = Path(data_dir) / task / "test.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"missing dataset: no {path}; write it with "
                                f"python -m replayssm_eval.accuracy.synthetic --task {task} --split test --out {data_dir}")
    return datasets.DatasetDict({"test": datasets.load_dataset("json", data_files=[str(path)], split="train")})

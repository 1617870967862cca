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
"""

from __future__ import annotations

from pathlib import Path

import datasets
import lm_eval.tasks
from lm_eval.api.task import ConfigurableTask
from lm_eval.tasks._yaml_loader import load_yaml

from replayssm_eval.tasks import FIXTURES_DIR

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

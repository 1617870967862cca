"""Find and read result JSON: `kl.json` (docs/kl_json_schema.md), `accuracy.json` (`replayssm-eval accuracy`) and
`sensitivity.json` (docs/sensitivity_json_schema.md).

    results = load_results(["reports/kl-tiny-nemotron-h-...", "reports/acc-..."])

A path may be one of those files, a run directory holding them, or a folder whose run
directories (at any depth) hold them. Nothing else in a run directory is read, and a sensitivity
study's layer and head stages (kl runs of many variants) are read through its sensitivity.json. Where a result
records no state traffic for a config (accuracy results never do), the report computes it from
the model's SSM geometry (`tables._geometry`): a preset, or the model's `config.json` (a bundled
fixture, a local directory or the hub).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

RESULT_FILES = {"kl.json": "kl", "accuracy.json": "accuracy", "sensitivity.json": "sensitivity"}
SENSITIVITY_STAGES = ("layers", "heads")  # `kl.sensitivity.STAGES`: summarised by the study's sensitivity.json


@dataclass(frozen=True)
class Result:
    """One result file: its kind ("kl" or "accuracy"), where it is, and its parsed JSON."""

    kind: str
    path: Path
    data: dict
    run: str  # the run directory's name: tells two runs of one model apart

    @property
    def model(self) -> str:
        return str(self.data.get("model") or "unknown model")

    @property
    def label(self) -> str:
        return f"{self.model} ({self.run})"

    @property
    def slug(self) -> str:
        """A file-name-safe id, unique among the results of one report (see `load_results`)."""
        text = self.run if self.run.startswith(self.kind) else f"{self.kind}-{self.run}"
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def find_result_files(path: Path) -> list[Path]:
    path = Path(path)
    if path.is_file():
        if path.name not in RESULT_FILES:
            raise ValueError(f"{str(path)!r} is not a result file; accepted: {', '.join(RESULT_FILES)} "
                             "or a directory holding them")
        return [path]
    if not path.is_dir():
        raise ValueError(f"result directory {str(path)!r} does not exist")
    found = sorted(p for name in RESULT_FILES for p in path.rglob(name) if not _in_sensitivity_stage(p))
    if not found:
        raise ValueError(f"no {' or '.join(RESULT_FILES)} in {str(path)!r} or below it")
    return found


def _in_sensitivity_stage(path: Path) -> bool:
    return path.parent.name in SENSITIVITY_STAGES and (path.parent.parent / "sensitivity.json").is_file()


def load_results(paths) -> list[Result]:
    """Every result under `paths`, in the order given (each path's files sorted), each file once."""
    results, seen = [], set()
    for given in paths:
        for file in find_result_files(given):
            key = file.resolve()
            if key in seen:
                continue
            seen.add(key)
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise ValueError(f"{file}: not valid JSON ({err})") from err
            kind = RESULT_FILES[file.name]
            _check(kind, file, data)
            study = file.parent.parent
            run = f"{study.name}/{file.parent.name}" if (study / "sensitivity.json").is_file() else file.parent.name
            results.append(Result(kind, file, data, run))  # a study's budget stage is named with its study
    if not results:
        raise ValueError("no results given")
    return _unique_slugs(results)


def _check(kind: str, file: Path, data: dict) -> None:
    need = {"kl": ("model", "configs", "reference"), "accuracy": ("tasks",),
            "sensitivity": ("model", "config", "layers", "heads", "uniform")}[kind]
    missing = [k for k in need if k not in data]
    if missing:
        raise ValueError(f"{file}: missing {', '.join(missing)}; is it a {kind} result?")


def _unique_slugs(results: list[Result]) -> list[Result]:
    """Runs in directories of the same name get their parent's name and a number to tell them apart."""
    slugs = [r.slug for r in results]
    if len(set(slugs)) == len(slugs):
        return results
    return [replace(r, run=f"{r.path.parent.parent.name}-{r.run}-{i}") for i, r in enumerate(results)]

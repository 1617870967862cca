"""`replayssm-eval regress`: the numerics suite against the committed baseline, or an external kernel's conformance.

    replayssm-eval regress                                   # suite vs replayssm_eval/regress/baseline.json
    replayssm-eval regress --part kernel --part chunked      # a subset
    replayssm-eval regress --update-baseline                 # record improvements and new metrics
    replayssm-eval regress --kernel my_pkg.adapters:vllm_step --device cuda   # external decode kernel

Exit status: 0 when nothing regressed (or every case conformed), 1 otherwise, 2 on bad input.
docs/regress.md describes the metrics, their tolerances and the adapter signature.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from replayssm_eval.cli import command
from replayssm_eval.options import option, resolve_device
from replayssm_eval.regress import BASELINE
from replayssm_eval.results.files import atomic_write_bytes


@dataclass(frozen=True)
class RegressConfig:
    """Options of `replayssm-eval regress` (one field per option)."""

    baseline: str | None = option(None, f"baseline JSON (default: the committed {BASELINE.name} of the package)")
    update_baseline: bool = option(False, "record improved and new metrics in the baseline (regressions only "
                                           "with --accept-regressions)")
    accept_regressions: bool = option(False, "with --update-baseline: record regressed metrics too "
                                              "(an intended numerics change)")
    part: tuple[str, ...] = option((), "suite part to run: format, bits, kernel, chunked, kl, stats (default: all)")
    only: tuple[str, ...] = option((), "run only the metrics matching this glob, e.g. 'kernel/mamba2/*'")
    show_all: bool = option(False, "list every metric, not only those that moved")
    json_output: str | None = option(None, "write the metrics and their status to this JSON file")
    kernel: str | None = option(None, "check an external decode kernel instead: module:function or file.py:function "
                                       "(adapter signature in docs/regress.md)")
    kernel_grid: str = option("full", "--kernel: the cases (quick: one window, shape and seed)", ("full", "quick"))
    kernel_family: tuple[str, ...] = option((), "--kernel: the kernel families to check (default: all)")
    kernel_configs: tuple[str, ...] = option((), "--kernel: ReplayConfigs to check instead of the grid's "
                                                  "({L} = each window of the grid)")
    device: str = option("cpu", "--kernel: device of the inputs handed to the adapter", ("cpu", "cuda"))


@command("regress")
def regress_command(config: RegressConfig) -> int:
    if config.json_output:
        _check_output_file(config.json_output)
    if config.kernel:
        return _conformance(config)
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel module is imported
    from replayssm_eval.regress import compare
    from replayssm_eval.regress.suite import PARTS, metric_kinds, run_suite

    parts = config.part or PARTS
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown --part {unknown[0]!r}; known: {', '.join(PARTS)}")
    path = Path(config.baseline) if config.baseline else BASELINE
    if config.accept_regressions and not config.update_baseline:
        raise ValueError("--accept-regressions needs --update-baseline")
    baseline_all = compare.read_baseline(path) if path.is_file() or not config.update_baseline else {}
    in_parts = lambda name: name.split("/", 1)[0] in parts and (  # noqa: E731
        not config.only or any(fnmatch.fnmatchcase(name, p) for p in config.only))
    baseline = {k: v for k, v in baseline_all.items() if in_parts(k)}
    known = {*metric_kinds(tuple(parts)), *(k for k in baseline_all if k.split("/", 1)[0] in parts)}
    _check_only_matches(config.only, known, parts)

    start = time.perf_counter()
    current = run_suite(tuple(parts), only=config.only, log=lambda line: print(f"  {line}", file=sys.stderr))
    elapsed = time.perf_counter() - start
    rows = compare.compare(current, baseline)
    print(compare.format_table(rows, show_all=config.show_all))
    failed = [r for r in rows if r.failed]
    improved = [r for r in rows if r.status in ("improved", "new")]
    checked = [r for r in rows if r.status in ("ok", "improved", "REGRESSED")]
    if config.json_output:
        atomic_write_bytes(Path(config.json_output), (json.dumps({
            "seconds": elapsed, "baseline": str(path),
            "metrics": [{"name": r.name, "kind": r.kind, "baseline": r.baseline, "current": r.current,
                         "status": r.status} for r in rows]}, indent=2) + "\n").encode())
    if config.update_baseline:
        kept = {k: v for k, v in baseline_all.items() if not in_parts(k)}
        new = compare.updated_metrics(rows, current, baseline, config.accept_regressions)
        compare.write_baseline(path, {**kept, **new})
        recorded = len(improved) + (len(failed) if config.accept_regressions else 0)
        print(f"updated {path}: recorded {recorded} metric(s)")
        if config.accept_regressions:
            failed = []
    elif improved:
        print(f"{len(improved)} metric(s) improved or new: record them with --update-baseline")
    if not checked and not config.update_baseline:  # a gate that compared nothing passes nothing
        print(f"{len(rows)} metrics in {elapsed:.0f} s: none compared with the baseline (FAILED: a gate must check "
              f"at least one metric)")
        return 1
    if failed and path.is_file():  # numbers of another CPU or package set move in their last bits
        from replayssm_eval.results.provenance import machine, versions

        recorded, here = compare.baseline_origin(path), compare.origin(machine(), versions())
        if recorded != here:
            print(f"baseline recorded on: {recorded}\nthis run on:          {here}")
    print(f"{len(rows)} metrics in {elapsed:.0f} s: " + (f"{len(failed)} REGRESSED" if failed else "no regression"))
    return 1 if failed else 0


def _check_output_file(path: str) -> None:
    """ValueError unless `path` can be written as a file: not a folder, in an existing writable folder."""
    target = Path(path)
    accepted = "accepted: a file path in an existing writable folder"
    if target.is_dir():
        raise ValueError(f"--json-output {path!r} is a folder; {accepted}")
    folder = target.absolute().parent
    if not folder.is_dir():
        raise ValueError(f"--json-output {path!r}: folder {str(folder)!r} does not exist; {accepted}")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"--json-output {path!r} is not writable (read-only filesystem or permissions); {accepted}")


def _check_only_matches(patterns: tuple[str, ...], names: set[str], parts: tuple[str, ...]) -> None:
    """ValueError naming the first --only pattern that matches no metric of `parts`, with an example name of each part."""
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            examples = {}
            for name in sorted(names):
                pieces = name.split("/")
                examples.setdefault(pieces[0], name if len(pieces) <= 2 else "/".join(pieces[:2]) + "/*")
            raise ValueError(f"--only {pattern!r} matches no metric of --part {','.join(parts)}; known, e.g.: "
                             f"{', '.join(examples.values())}")


def _conformance(config: RegressConfig) -> int:
    if config.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from replayssm_eval.regress import conformance

    adapter = conformance.load_adapter(config.kernel)
    cases = conformance.grid_cases(config.kernel_grid, config.kernel_family or conformance.FAMILIES,
                                   config.kernel_configs)
    resolve_device(config.device)
    print(f"checking {config.kernel} on {len(cases)} cases against decode_reference", file=sys.stderr)
    results = conformance.check_kernel(adapter, cases, device=config.device)
    print(conformance.format_results(results))
    if config.json_output:
        atomic_write_bytes(Path(config.json_output), (json.dumps([
            {"case": r.case.name, "status": r.status, "y_rel_rms": r.y_rel_rms, "hi_flips": r.hi_flips,
             "lo_flips": r.lo_flips, "message": r.message} for r in results], indent=2) + "\n").encode())
    return 1 if any(r.status == "FAIL" for r in results) or not any(r.status == "pass" for r in results) else 0

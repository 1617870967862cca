"""Compare suite metrics with the committed baseline: status per metric, the diff table, baseline updates.

Status of a metric, with its kind's `suite.TOLERANCES` entry:
    ok          within the tolerance (or equal, for exact kinds)
    REGRESSED   worse than the baseline beyond the tolerance (for a two-sided kind: moved either way), a
                changed hash, a non-finite value, or a baseline metric the suite no longer produces (MISSING)
    improved    better than the baseline beyond the tolerance
    new         not in the baseline
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from replayssm_eval.regress.suite import SUITE_VERSION, TOLERANCES

BASELINE_VERSION = 1


@dataclass(frozen=True)
class Row:
    name: str
    kind: str
    baseline: float | str | None
    current: float | str | None
    status: str  # ok | REGRESSED | MISSING | improved | new

    @property
    def failed(self) -> bool:
        return self.status in ("REGRESSED", "MISSING")

    @property
    def change(self) -> str:
        if isinstance(self.baseline, (int, float)) and isinstance(self.current, (int, float)):
            delta = self.current - self.baseline
            if self.baseline:
                return f"{delta:+.3g} ({delta / abs(self.baseline):+.1%})"
            return f"{delta:+.3g}"
        return "changed" if self.baseline != self.current and None not in (self.baseline, self.current) else ""


def status_of(kind: str, baseline, current) -> str:
    tol = TOLERANCES[kind]
    if tol.exact:
        return "ok" if current == baseline else "REGRESSED"
    if current is None or not math.isfinite(current):
        return "REGRESSED"
    delta = current - baseline
    bound = tol.atol + tol.rtol * abs(baseline)
    if tol.lower_is_better is None:  # a fixed value: a move either way regresses
        return "ok" if abs(delta) <= bound else "REGRESSED"
    if not tol.lower_is_better:
        delta = -delta
    if delta > bound:
        return "REGRESSED"
    if -delta > bound:
        return "improved"
    return "ok"


def compare(current: dict[str, dict], baseline: dict[str, dict]) -> list[Row]:
    """One Row per metric in either; `current` and `baseline` map name -> {"kind", "value"}."""
    rows = []
    for name in sorted(set(current) | set(baseline)):
        cur, base = current.get(name), baseline.get(name)
        if base is None:
            rows.append(Row(name, cur["kind"], None, cur["value"], "new"))
        elif cur is None:
            rows.append(Row(name, base["kind"], base["value"], None, "MISSING"))
        else:
            rows.append(Row(name, cur["kind"], base["value"], cur["value"],
                            status_of(cur["kind"], base["value"], cur["value"])))
    return rows


def _show(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(rows: list[Row], show_all: bool = False) -> str:
    """The diff table: every metric that is not ok (all with show_all), then a count per kind and status."""
    shown = [r for r in rows if show_all or r.status != "ok"]
    lines = []
    if shown:
        width = max(len(r.name) for r in shown)
        head = f"{'status':9} {'metric':{width}} {'baseline':>18} {'current':>18}  {'change':22} tolerance"
        lines += [head, "-" * len(head)]
        for r in shown:
            lines.append(f"{r.status:9} {r.name:{width}} {_show(r.baseline):>18} {_show(r.current):>18}  "
                         f"{r.change:22} {TOLERANCES[r.kind].describe()}")
        lines.append("")
    summary = {}
    for r in rows:
        summary.setdefault(r.kind, {}).setdefault(r.status, 0)
        summary[r.kind][r.status] += 1
    for kind, counts in summary.items():
        lines.append(f"{kind:14} " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return "\n".join(lines)


def read_baseline(path: Path) -> dict[str, dict]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"baseline {str(path)!r} does not exist; create it with --update-baseline")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"baseline {path} is not valid JSON ({err}); accepted: a baseline written by "
                         f"--update-baseline") from err
    if not isinstance(data, dict) or data.get("schema_version") != BASELINE_VERSION:
        version = data.get("schema_version") if isinstance(data, dict) else None
        raise ValueError(f"baseline {path} has schema_version {version!r}, "
                         f"expected {BASELINE_VERSION}")
    return data["metrics"]


def origin(machine: dict, versions: dict) -> str:
    """Where numbers came from, in words: the CPU (its kernels set the last bits of float results) and packages."""
    cpu = machine.get("processor", "?") + (f" ({machine['cpu_capability']})" if machine.get("cpu_capability") else "")
    return f"{cpu}, " + ", ".join(f"{name} {version}" for name, version in versions.items() if name != "replayssm_eval")


def baseline_origin(path: Path) -> str:
    """`origin` of the baseline file at `path` (read with `read_baseline` first: it checks the file)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return origin(data.get("machine", {}), data.get("versions", {}))


def updated_metrics(rows: list[Row], current: dict, baseline: dict, accept_regressions: bool) -> dict:
    """The baseline after an update: improved and new metrics recorded, dropped ones removed,
    regressions recorded only when accepted, metrics within tolerance kept at their old value."""
    out = {}
    for r in rows:
        if r.status == "ok":
            out[r.name] = baseline[r.name]
        elif r.status in ("improved", "new") or (r.status == "REGRESSED" and accept_regressions):
            out[r.name] = current[r.name]
        elif r.status == "REGRESSED":
            out[r.name] = baseline[r.name]
    return out


def write_baseline(path: Path, metrics: dict) -> None:
    from replayssm_eval.results.files import atomic_write_json
    from replayssm_eval.results.provenance import git_state, machine, versions

    atomic_write_json(Path(path), {
        "schema_version": BASELINE_VERSION,
        "suite_version": SUITE_VERSION,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "git": git_state(),
        "metrics": dict(sorted(metrics.items())),
    })

"""Tables of a report, computed from result JSON only: per-bucket KL, accuracy gaps, state traffic, Pareto points.

A `Table` holds strings, so the HTML and the Markdown renderings show the same digits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from replayssm_eval.reports.load import Result

KIB = 1024.0


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""
    align: list[str] = field(default_factory=list)  # "l" or "r" per column (default: first l, rest r)

    def alignment(self) -> list[str]:
        return self.align or ["l"] + ["r"] * (len(self.columns) - 1)


def _sci(v) -> str:
    return "–" if v is None else f"{v:.3g}" if v == 0 or 1e-3 <= abs(v) < 1e4 else f"{v:.2e}"


def _bucket(b: dict) -> str:
    return f"{b['start']}" if b["start"] == b["end"] else f"{b['start']}–{b['end']}"


def kl_bucket_table(result: Result) -> Table:
    """Rows: length buckets; columns: tokens, reference NLL, then each config's mean KL and 95% interval."""
    from replayssm_eval.results.kl_tables import buckets_table

    report = result.data
    configs = [c["name"] for c in report["configs"]]
    frame = buckets_table(report)
    ref = {(b["start"], b["end"]): b for b in report["reference"]["buckets"]}
    rows = []
    for (start, end), group in frame.groupby(["start", "end"], sort=True) if len(frame) else []:
        by_config = {row["config"]: row for row in group.to_dict("records")}
        cells = [_bucket({"start": start, "end": end}), str(int(group["count"].iloc[0])),
                 f"{ref[(start, end)]['nll_mean']:.3f}" if (start, end) in ref else "–"]
        for name in configs:
            b = by_config.get(name)
            cell = _sci(b["kl_mean"]) if b else "–"
            if b and _present(b.get("kl_ci_low")) and _present(b.get("kl_ci_high")):
                cell += f" [{_sci(b['kl_ci_low'])}, {_sci(b['kl_ci_high'])}]"
            cells.append(cell)
        rows.append(cells)
    docs = report.get("documents_done", report.get("num_docs"))
    note = (f"mean KL(p_fp32 || p_config) in nats per token over the bucket's tokens; [95% CI] over the "
            f"{docs} documents' bucket means (none with one document). NLL: the FP32 reference's, nats/token.")
    if not report.get("complete", True):
        note += f" INCOMPLETE run: {docs} of {report.get('num_docs')} documents."
    return Table(f"{result.label}: KL per generated-length bucket",
                 ["generated tokens", "tokens", "fp32 NLL", *configs], rows, note)


def kl_statistics_table(result: Result) -> Table:
    """llama.cpp's --kl-divergence figures per config, over all tokens and per bucket ("–": absent in older runs)."""
    rows = []
    for c in result.data["configs"]:
        for scope, s in [("all", c), *((_bucket(b), b) for b in c["buckets"])]:
            rows.append([c["name"], scope, _plus_minus(s.get("kl_mean"), s.get("kl_se"), 1, _sci),
                         _sci(s.get("kl_p99_9")), _sci(s.get("kl_max")),
                         _plus_minus(s.get("delta_p_mean"), s.get("delta_p_se"), 100, _percent),
                         _plus_minus(s.get("delta_p_rms"), s.get("delta_p_rms_se"), 100, _percent),
                         _plus_minus(s.get("same_top_p_pct"), s.get("same_top_p_se_pct"), 1, _percent)])
    note = ("As llama.cpp's perplexity --kl-divergence prints them: mean ± standard error over tokens; Δp = "
            "p_config − p_fp32 of the text's next token, in %; same top p: tokens whose argmaxes agree, in %. "
            "kl.json has every percentile.")
    return Table(f"{result.label}: KL statistics", ["config", "generated tokens", "KL mean ± se", "KL p99.9",
                                                    "KL max", "Δp mean ± se (%)", "RMS Δp (%)", "same top p (%)"],
                 rows, note, align=["l", "l", "r", "r", "r", "r", "r", "r"])


def _percent(v) -> str:
    return f"{v:.3f}"


def _plus_minus(value, error, scale: float, fmt) -> str:
    """`value ± error`, both times `scale` in `fmt`; "–" without a value, the value alone without an error."""
    if value is None:
        return "–"
    return fmt(scale * value) + ("" if error is None else f" ± {fmt(scale * error)}")


def _present(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def kl_summary_table(results: list[Result]) -> Table:
    """One row per (run, config): KL over all tokens, at the longest bucket, top-1 agreement, NLL change."""
    rows = []
    for r in results:
        for c in r.data["configs"]:
            last = c["buckets"][-1] if c["buckets"] else None
            rows.append([r.label, c["name"], _sci(c.get("kl_mean")),
                         f"{_sci(last['kl_mean'])} ({_bucket(last)})" if last else "–",
                         "–" if c.get("top1_agree") is None else f"{100 * c['top1_agree']:.2f}",
                         _sci(c.get("nll_diff_mean"))])
    return Table("KL summary", ["run", "config", "KL mean", "KL at the longest bucket", "top-1 agree (%)",
                                "NLL change (nats)"], rows, align=["l", "l", "r", "r", "r", "r"])


def _points(v) -> str:
    return "–" if v is None else f"{100 * v:+.1f}"


def accuracy_tables(result: Result) -> list[Table]:
    """`accuracy_table` of every task of an accuracy run."""
    return [accuracy_table(result, task) for task in result.data["tasks"]]


def accuracy_table(result: Result, task: str) -> Table:
    """The paper's GPQA layout: bucket, n, FP32 accuracy (%), then each config's change in points.

    A change cell: gap [95% CI] in points; * marks p < 0.05 (McNemar; the sign-flip test with several
    samples per question); flips to wrong / to right follow as (−w/+r). The pooled row ("all") comes
    last when the task records one; the share of FP32 generations truncated at max_gen_toks is the last
    column when recorded.
    """
    entry = result.data["tasks"][task]
    blocks, pooled = _task_rows(entry)
    configs = _config_names(blocks)
    truncated = any(_truncated(b) is not None for b in _task_buckets(entry))
    rows = []
    for b in blocks:
        cells = ["all" if b is pooled else _bucket(b), str(b.get("n", "–")),
                 "–" if b.get("fp32_acc") is None else f"{100 * b['fp32_acc']:.1f}"]
        for name in configs:
            c = b.get("configs", {}).get(name)
            if c is None or c.get("gap") is None:
                cells.append("–")
                continue
            cell = _points(c.get("gap"))
            if _present(c.get("ci_low")) and _present(c.get("ci_high")):
                cell += f" [{_points(c['ci_low'])}, {_points(c['ci_high'])}]"
            if _present(c.get("p_value")) and c["p_value"] < 0.05:
                cell += "*"
            if "flips_to_wrong" in c or "flips_to_right" in c:
                cell += f" (−{c.get('flips_to_wrong', 0)}/+{c.get('flips_to_right', 0)})"
            cells.append(cell)
        if truncated:
            cells.append("–" if _truncated(b) is None else f"{100 * _truncated(b):.0f}")
        rows.append(cells)
    columns = ["generated tokens (fp32)", "n", "fp32 acc (%)", *(f"{c} Δ (pts)" for c in configs)]
    if truncated:
        columns.append("fp32 truncated (%)")
    limit = f", max_gen_toks {entry['max_gen_toks']}" if isinstance(entry, dict) and "max_gen_toks" in entry else ""
    test = "sign-flip" if isinstance(entry, dict) and entry.get("samples", 1) > 1 else "McNemar"
    return Table(
        f"{result.label}: {task}{limit}", columns, rows,
        "Buckets by the FP32 run's generation length. Δ: the config's accuracy minus FP32's, in points, "
        f"[95% paired bootstrap CI]; * {test} p < 0.05; (−a/+b): answers that flipped to wrong / to right.")


def degeneration_tables(result: Result) -> list[Table]:
    """`degeneration_table` of every task of an accuracy run that records one."""
    return [t for t in (degeneration_table(result, task) for task in result.data["tasks"]) if t is not None]


def degeneration_table(result: Result, task: str) -> Table | None:
    """Mean generated tokens / share cut at max_gen_toks / loop rate, per FP32 length bucket, for FP32 and each
    config (the loop detector: docs/accuracy_json_schema.md); None when the task records none."""
    blocks, pooled = _task_rows(result.data["tasks"][task])
    if not any("fp32_mean_gen_tokens" in b for b in blocks):
        return None
    configs = _config_names(blocks)
    rows = []
    for b in blocks:
        cells = ["all" if b is pooled else _bucket(b), str(b.get("n", "–")),
                 _degeneration(b.get("fp32_mean_gen_tokens"), _truncated(b), b.get("fp32_loop_rate"))]
        for name in configs:
            c = b.get("configs", {}).get(name, {})
            cells.append(_degeneration(c.get("mean_gen_tokens"), c.get("truncated"), c.get("loop_rate")))
        rows.append(cells)
    return Table(
        f"{result.label}: {task}, degeneration", ["generated tokens (fp32)", "n", "fp32", *configs], rows,
        "Each cell: mean generated tokens / % cut at max_gen_toks / % of generations whose tail loops.")


def _degeneration(mean_tokens, truncated, loop_rate) -> str:
    if mean_tokens is None:
        return "–"
    parts = [f"{mean_tokens:.0f}", "–" if truncated is None else f"{100 * truncated:.0f}",
             "–" if loop_rate is None else f"{100 * loop_rate:.0f}"]
    return " / ".join(parts)


def _task_rows(entry) -> tuple[list[dict], dict | None]:
    """A task's buckets followed by its pooled entry ("all") when it records one, and that pooled entry."""
    pooled = entry.get("all") if isinstance(entry, dict) else None
    return [*_task_buckets(entry), *([pooled] if pooled else [])], pooled


def _config_names(blocks: list[dict]) -> list[str]:
    return list(dict.fromkeys(name for b in blocks for name in b.get("configs", {})))


def _task_buckets(entry):
    return entry["buckets"] if isinstance(entry, dict) else entry


def _truncated(bucket: dict):
    return bucket.get("fp32_truncated", bucket.get("truncated"))


# --- state traffic -----------------------------------------------------------------------------

@dataclass(frozen=True)
class TrafficRow:
    """Per decode token and sequence, whole model (all SSM layers), in bytes."""

    model: str
    config: str
    read: str
    recur: str
    window: int
    conventional: float | None  # eager decoding with the state in the recurrence format
    conventional_fp32: float | None
    replay: float | None
    note: str = ""
    kl: float | None = None  # mean KL of a KL run's config
    skipped: float | None = None  # share of checkpoint reads #skip dropped (kl.json skip_reads)
    replay_with_skip: float | None = None  # ReplaySSM traffic less the skipped reads


def traffic_rows(results: list[Result]) -> list[TrafficRow]:
    """From kl.json's `state_traffic`; configs without it (accuracy runs, speculative schedules) are computed
    with `models.state_traffic` from the model name when it resolves to a preset or a local config."""
    rows, seen = [], set()
    for r in sorted(results, key=lambda r: r.kind != "kl"):  # recorded traffic first
        for name, entry in _configs_of(r):
            key = (r.model, name)
            if key in seen:
                continue
            seen.add(key)
            traffic = entry.get("state_traffic") if entry else None
            note = ""
            if traffic is None:
                traffic, note = _compute_traffic(r.model, name)
            row = _traffic_row(r.model, name, traffic, note)
            if entry:
                total = (entry.get("skip_reads") or {}).get("total", {})
                row = dataclasses.replace(row, kl=entry.get("kl_mean"), skipped=total.get("skipped_fraction"),
                                          replay_with_skip=total.get("replay_with_skip"))
            rows.append(row)
    return rows


def _configs_of(result: Result):
    if result.kind == "kl":
        return [(c["name"], c) for c in result.data["configs"]]
    names = dict.fromkeys(name for entry in result.data["tasks"].values()
                          for b in _task_buckets(entry) for name in b.get("configs", {}))
    return [(n, None) for n in names if n != "fp32"]


def _traffic_row(model: str, name: str, traffic: dict | None, note: str) -> TrafficRow:
    from replayssm_eval.replay.config import ReplayConfig

    try:
        cfg = ReplayConfig.parse(name)
        read, recur, window = cfg.read, cfg.recur, cfg.window
    except ValueError:
        read = recur = "?"
        window = 0
    if traffic is None:
        return TrafficRow(model, name, read, recur, window, None, None, None, note)
    per = traffic["per_model"]
    return TrafficRow(model, name, read, recur, window, per["conventional"], per["conventional_fp32"],
                      per["replay"], note)


def _compute_traffic(model: str, name: str) -> tuple[dict | None, str]:
    from replayssm_eval.models.traffic import state_traffic

    try:
        return state_traffic(_geometry(model), name), "computed from the model config"
    except Exception as err:  # unknown model, offline hub, speculative schedule: say why, render the rest
        return None, f"not computed: {err}"


def _geometry(model: str):
    from replayssm_eval.models.presets import get_preset

    try:
        return get_preset(model)
    except (ValueError, KeyError):
        pass
    from transformers import AutoConfig

    from replayssm_eval.models.fixtures import resolve_model

    return AutoConfig.from_pretrained(resolve_model(model))


def traffic_table(rows: list[TrafficRow]) -> Table:
    kib = lambda v: "–" if v is None else f"{v / KIB:,.1f}"  # noqa: E731
    out = []
    for t in rows:
        ratio = "–" if not t.replay else f"{t.conventional / t.replay:.2f}×"
        ratio32 = "–" if not t.replay else f"{t.conventional_fp32 / t.replay:.2f}×"
        out.append([t.model, t.config, t.read, t.recur, str(t.window), kib(t.conventional_fp32), kib(t.conventional),
                    kib(t.replay), ratio, ratio32, t.note])
    columns = ["model", "config", "read copy", "recurrence copy", "window", "conventional FP32",
               "conventional (recurrence format)", "ReplaySSM", "conventional / ReplaySSM", "FP32 / ReplaySSM", "note"]
    align = ["l", "l", "l", "l", "r", "r", "r", "r", "r", "r", "l"]
    if not any(t.note for t in rows):
        columns, out, align = columns[:-1], [row[:-1] for row in out], align[:-1]
    extra = []
    if any(t.kl is not None for t in rows):
        extra.append(("KL (mean)", [_sci(t.kl) for t in rows]))
    if any(t.skipped is not None for t in rows):
        extra.append(("reads skipped", ["–" if t.skipped is None else f"{100 * t.skipped:.2f}%" for t in rows]))
        extra.append(("ReplaySSM with skip", [kib(t.replay_with_skip) for t in rows]))
    for title, cells in extra:
        columns, align = columns + [title], align + ["r"]
        out = [row + [cell] for row, cell in zip(out, cells)]
    return Table("SSM state memory traffic per decode token (one sequence, all SSM layers), KiB", columns, out,
                 "Conventional decoding reads and writes the whole state every token; ReplaySSM reads the read "
                 "copy, writes a checkpoint once per window and reads/writes the bf16 ring buffer "
                 "(models/traffic.py). ReplaySSM is the upper bound of a #skip config; reads skipped: the share "
                 "of (token, head) checkpoint reads its threshold dropped in the run, and ReplaySSM with skip the "
                 "traffic less those reads.", align=align)


# --- Pareto ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParetoPoint:
    config: str
    traffic: float  # bytes per decode token, whole model (less the skipped reads of a #skip config)
    kl: float  # mean KL at the longest bucket
    frontier: bool = False
    bits: float | None = None  # bits per state element of the read copy, scales included
    kl_mean: float | None = None  # over all tokens
    top1: float | None = None
    skipped: float | None = None  # share of checkpoint reads #skip dropped


def pareto_points(result: Result) -> tuple[list[ParetoPoint], tuple[int, int] | None]:
    """(points, longest bucket) of a KL run; a point is on the frontier if no other point has both
    traffic <= and KL <= with one of them strictly smaller."""
    points, bucket = [], None
    for c in result.data["configs"]:
        recorded = c.get("state_traffic") or _compute_traffic(result.model, c["name"])[0]
        traffic = recorded["per_model"]["replay"] if recorded else None
        skip = (c.get("skip_reads") or {}).get("total") or {}
        if skip.get("replay_with_skip") is not None:
            traffic = skip["replay_with_skip"]
        if traffic is None or not c["buckets"] or c["buckets"][-1]["kl_mean"] is None:
            continue
        last = c["buckets"][-1]
        bucket = (last["start"], last["end"])
        points.append(ParetoPoint(c["name"], traffic, last["kl_mean"], bits=read_bits(recorded),
                                  kl_mean=c.get("kl_mean"), top1=c.get("top1_agree"),
                                  skipped=skip.get("skipped_fraction")))
    return [dataclasses.replace(p, frontier=on_frontier(p, points, "traffic")) for p in points], bucket


def read_bits(traffic: dict | None) -> float | None:
    """Bits per state element of the read copy (scales included), from a `state_traffic` record; a mixed config's
    mean over its SSM layers."""
    if not traffic:
        return None
    elements = math.prod(traffic["geometry"]["state"])
    layers = traffic["geometry"]["num_ssm_layers"]
    named = [t["bytes_per_copy"]["read"] for t in traffic.get("per_layer", {}).values()]
    total = traffic["bytes_per_copy"]["read"] * (layers - len(named)) + sum(named)
    return 8 * total / (elements * layers)


def on_frontier(p: ParetoPoint, points: list[ParetoPoint], cost: str) -> bool:
    """No other point has both `cost` <= and KL <= with one of them strictly smaller."""
    mine = getattr(p, cost)
    if mine is None:
        return False
    return not any(getattr(q, cost) is not None and getattr(q, cost) <= mine and q.kl <= p.kl
                   and (getattr(q, cost) < mine or q.kl < p.kl) for q in points)


def pareto_table(result: Result, points: list[ParetoPoint], bucket) -> Table:
    """One row per config, by traffic: read bits per element, traffic, reads skipped, KL, top-1, frontier."""
    fmt = lambda v, spec: "–" if v is None else format(v, spec)  # noqa: E731
    rows = [[p.config, fmt(p.bits, ".2f"), f"{p.traffic / KIB:,.1f}",
             "–" if p.skipped is None else f"{100 * p.skipped:.2f}%", _sci(p.kl_mean), _sci(p.kl),
             fmt(p.top1, ".4f"), "yes" if p.frontier else ""]
            for p in sorted(points, key=lambda p: p.traffic)]
    span = f"{bucket[0]}–{bucket[1]}" if bucket else "?"
    return Table(f"{result.label}: traffic vs KL at generated tokens {span}",
                 ["config", "read bits/element", "ReplaySSM traffic (KiB/token)", "reads skipped", "KL (mean)",
                  f"KL ({span})", "top-1 agree", "on the frontier"], rows)


def formats_table(results: list[Result]) -> Table:
    """One row per config of the KL runs, one column group per run: read bits per element, then per run the
    ReplaySSM traffic (less skipped reads), the reads skipped and the mean KL; engine presets named beside
    the config they expand to. The BENCHMARKS.md formats table."""
    from replayssm_eval.replay.config import ReplayConfig
    from replayssm_eval.replay.engine_presets import PRESETS

    presets: dict[str, list[str]] = {}
    for p in PRESETS.values():
        presets.setdefault(ReplayConfig.parse(p.expansion).name, []).append(p.name)
    by_run = [{p.config: p for p in pareto_points(r)[0]} for r in results]
    configs = list(dict.fromkeys(name for points in by_run for name in points))
    rows = []
    for name in configs:
        first = next(points[name] for points in by_run if name in points)
        label = f"`{name}`" + (f" ({', '.join(presets[name])})" if name in presets else "")
        row = [label, "–" if first.bits is None else f"{first.bits:.2f}"]
        for points in by_run:
            p = points.get(name)
            row += ["–"] * 3 if p is None else [
                f"{p.traffic / KIB:,.1f}", "–" if p.skipped is None else f"{100 * p.skipped:.2f}%", _sci(p.kl_mean)]
        rows.append(row)
    columns = ["config", "read bits/element"]
    for r in results:
        columns += [f"{r.model}: KiB/token", f"{r.model}: reads skipped", f"{r.model}: KL"]
    return Table("Read formats, engine presets, buffer dtype and decay skip: state traffic and KL", columns, rows,
                 "read bits/element: the read copy (a shared config's only copy), scales included. KiB/token: "
                 "ReplaySSM state traffic per decode token and sequence, all SSM layers, less the reads #skip "
                 "dropped. KL: mean KL(p_fp32 || p_config) over all generated tokens, nats/token.",
                 align=["l"] + ["r"] * (len(columns) - 1))


# --- provenance ------------------------------------------------------------------------------

def provenance_table(result: Result) -> Table:
    d = result.data
    versions = d.get("versions") or {}
    git = d.get("git") or {}
    commit = git.get("commit") or "unknown"
    if git.get("dirty"):
        commit += " (uncommitted changes)"
    if result.kind == "kl":
        seeds = ", ".join(f"{c['name']}: {c.get('seed', 0)}" for c in d["configs"])
        data = (f"{(d.get('resolved') or {}).get('source', '?')}, documents {d.get('document_indices')}, "
                f"prompt {d.get('prompt_len')} + {d.get('tokens')} tokens")
    elif result.kind == "sensitivity":
        seeds = f"{d['config']}: its #seed tag (0 without one)"
        data = f"{d['num_docs']} documents x {d['tokens']} tokens (its stages' kl.json record the text)"
    else:
        seeds = d.get("seeds") or {k: v for k, v in d.items() if "seed" in k}
        seeds = ", ".join(f"{k}: {v}" for k, v in seeds.items()) if isinstance(seeds, dict) else str(seeds)
        seeds = seeds or "not recorded"
        data = ", ".join(d["tasks"])
    rows = [
        ["kind", result.kind], ["file", str(result.path)], ["model", result.model],
        ["date", str(d.get("date", "not recorded"))], ["git commit", commit],
        ["versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or "not recorded"],
        ["seeds (SR seed per config; documents key the bits)" if result.kind == "kl" else "seeds", seeds],
        ["data", data], ["command", str(d.get("command", "not recorded"))],
    ]
    if result.kind == "kl":
        resolved = d.get("resolved") or {}
        rows.append(["device / dtype / backend",
                     f"{resolved.get('device')} / {resolved.get('dtype')} / {resolved.get('backend')}"])
    return Table(result.label, ["field", "value"], rows, align=["l", "l"])

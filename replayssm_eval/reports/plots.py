"""matplotlib (Agg) PNGs: KL vs length (also a KL run's own plot), traffic bars, the traffic-KL Pareto plot."""

from __future__ import annotations

import io
import math

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from replayssm_eval.reports.load import Result  # noqa: E402
from replayssm_eval.reports.tables import KIB, ParetoPoint, TrafficRow  # noqa: E402

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINE_STYLES = ("-", "--", "-.", ":")
# label offsets tried in turn (points from the marker): beside it, then further above and below
LABEL_OFFSETS = [(dx, dy) for dy in (4, -10, 14, -20, 24, -30, 34, -40, 44, -50) for dx in (6, -6)]


def _png(fig, layout: bool = True) -> bytes:
    buffer = io.BytesIO()
    if layout:
        fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def kl_vs_length_png(report: dict) -> bytes:
    """Mean KL per bucket of a kl.json `report` against generated length (log-log), one line per config with its
    95% CI band: the run's kl_vs_length.png and the report's."""
    # zero cannot show on a log axis: means of 0 are left out, interval bounds of 0 drawn at `floor`
    means = [b["kl_mean"] for c in report["configs"] for b in c["buckets"] if b["kl_mean"]]
    floor = min(means, default=1.0) / 10
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for k, config in enumerate(report["configs"]):
        buckets = config["buckets"]
        x = [math.sqrt(b["start"] * b["end"]) for b in buckets]
        y = [b["kl_mean"] or np.nan for b in buckets]
        label = config["name"] if any(np.isfinite(y)) else f"{config['name']} (KL = 0)"
        # coinciding lines stay apart: each config its own marker, line style and marker size (largest first,
        # hollow, so a smaller marker drawn later shows inside a larger one)
        style = LINE_STYLES[k % len(LINE_STYLES)]
        (line,) = ax.plot(x, y, marker=MARKERS[k % len(MARKERS)], markersize=8 - 4 * k / max(len(report["configs"]), 1),
                          markerfacecolor="none", markeredgewidth=1.2, linestyle=style, linewidth=1.3, label=label)
        if all(b["kl_ci_high"] is not None for b in buckets):  # no interval with one document
            low = [max(b["kl_ci_low"], floor) for b in buckets]
            high = [max(b["kl_ci_high"], floor) for b in buckets]
            # a faint fill and outlined edges in the line's style: overlapping bands stay readable
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.04, linewidth=0)
            for edge in (low, high):
                ax.plot(x, edge, color=line.get_color(), linestyle=style, linewidth=0.7, alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor)
    ax.set_xlabel("generated tokens")
    ax.set_ylabel(f"KL(p_{report['reference']['name']} || p_config), nats/token")
    docs = report["documents_done"]
    ax.set_title(f"{report['model']}: {docs} document{'s' * (docs != 1)}, {report['tokens']} tokens", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    _legend(fig, ax, len(report["configs"]))
    return _png(fig)


def _legend(fig, ax, entries: int, inside: int = 10, per_column: int = 24) -> None:
    """Up to `inside` entries: the legend inside the axes; more (a sensitivity stage has 2 per SSM layer): outside on
    the right in columns of `per_column`, the figure widened to hold them."""
    if entries <= inside:
        ax.legend(fontsize=8)
        return
    columns = math.ceil(entries / per_column)
    width, height = fig.get_size_inches()
    fig.set_size_inches(width + 2.6 * columns, max(height, 0.16 * min(entries, per_column) + 1.0))
    ax.legend(fontsize=6, ncol=columns, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def traffic_png(model: str, rows: list[TrafficRow]) -> bytes | None:
    """Per config: conventional decoding (state in the recurrence format) and ReplaySSM, KiB per token."""
    rows = [r for r in rows if r.replay is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.6), dpi=110)
    y = range(len(rows))
    h = 0.38
    ax.barh([i + h / 2 for i in y], [r.conventional / KIB for r in rows], height=h,
            label="conventional (recurrence format)", color="#9aa5b1")
    ax.barh([i - h / 2 for i in y], [r.replay / KIB for r in rows], height=h, label="ReplaySSM", color="#2b6cb0")
    ax.axvline(rows[0].conventional_fp32 / KIB, color="#c53030", linestyle="--", linewidth=1, label="conventional FP32")
    ax.set_yticks(list(y), [r.config for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("SSM state traffic per decode token, KiB (one sequence, all SSM layers)")
    ax.set_title(model, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def pareto_png(result: Result, points: list[ParetoPoint], bucket, fp32_traffic: float | None) -> bytes | None:
    """KL at the longest bucket (y, log) against traffic per token (left) and read-copy bits per element (right),
    frontier points joined and ringed."""
    from replayssm_eval.reports.tables import on_frontier

    shown = [p for p in points if p.kl > 0]
    if not shown:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), dpi=110, sharey=True)
    panels = [("traffic", 1 / KIB, "ReplaySSM state traffic per decode token, KiB (log)", True),
              ("bits", 1.0, "read copy: bits per state element, scales included", False)]
    for ax, (cost, unit, label, log_x) in zip(axes, panels):
        mine = [p for p in shown if getattr(p, cost) is not None]
        front = sorted((p for p in mine if on_frontier(p, mine, cost)), key=lambda p: getattr(p, cost))
        for p in mine:
            ax.scatter(getattr(p, cost) * unit, p.kl, s=60 if p in front else 30, zorder=3,
                       color="#c05621" if p in front else "#718096", edgecolor="black" if p in front else "none")
        if len(front) > 1:
            ax.step([getattr(p, cost) * unit for p in front], [p.kl for p in front], where="post", color="#c05621",
                    linewidth=1.2, label="Pareto frontier")
        if cost == "traffic" and fp32_traffic:
            ax.axvline(fp32_traffic / KIB, color="#c53030", linestyle="--", linewidth=1,
                       label="conventional FP32 (KL 0)")
        if log_x:
            ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    span = f"{bucket[0]}–{bucket[1]}" if bucket else "the longest bucket"
    axes[0].set_ylabel(f"mean KL at generated tokens {span}")
    fig.suptitle(f"{result.label}", fontsize=10)
    fig.tight_layout()  # first: the labels are placed in the final layout's display coordinates
    for ax, (cost, unit, _, _) in zip(axes, panels):
        mine = [p for p in shown if getattr(p, cost) is not None]
        annotate_apart(fig, ax, [(getattr(p, cost) * unit, p.kl) for p in mine], [p.config for p in mine], fontsize=6)
    return _png(fig, layout=False)


def annotate_apart(fig, ax, points: list[tuple[float, float]], labels: list[str], fontsize: int = 7) -> list:
    """Label each point at the first of `LABEL_OFFSETS` whose text box overlaps no label placed before it and
    stays inside the axes (else the first free one, else the first); returns the annotations. Call it after
    the layout and the axes limits are final."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    placed, texts = [], []
    for (x, y), label in zip(points, labels):
        boxes = []
        for dx, dy in LABEL_OFFSETS:
            text = ax.annotate(label, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                               ha="left" if dx > 0 else "right", va="bottom")
            boxes.append(text.get_window_extent(renderer))
            text.remove()
        free = [i for i, box in enumerate(boxes) if not any(box.overlaps(b) for b in placed)]
        inside = [i for i in free if frame.x0 <= boxes[i].x0 and boxes[i].x1 <= frame.x1
                  and frame.y0 <= boxes[i].y0 and boxes[i].y1 <= frame.y1]
        best = (inside or free or [0])[0]
        dx, dy = LABEL_OFFSETS[best]
        texts.append(ax.annotate(label, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                                 ha="left" if dx > 0 else "right", va="bottom"))
        placed.append(boxes[best])
    return texts


def accuracy_gap_png(result: Result, task: str) -> bytes | None:
    """Each config's accuracy change (points) per FP32-length bucket, with its CI as error bars."""
    entry = result.data["tasks"][task]
    buckets = entry["buckets"] if isinstance(entry, dict) else entry
    configs = list(dict.fromkeys(n for b in buckets for n in b.get("configs", {})))
    if not buckets or not configs:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.8), dpi=110)
    width = 0.8 / len(configs)
    for k, name in enumerate(configs):
        xs, ys, lo, hi = [], [], [], []
        for i, b in enumerate(buckets):
            c = b.get("configs", {}).get(name)
            if c is None or c.get("gap") is None:
                continue
            xs.append(i - 0.4 + width * (k + 0.5))
            ys.append(100 * c["gap"])
            lo.append(100 * (c["gap"] - c["ci_low"]) if c.get("ci_low") is not None else 0)
            hi.append(100 * (c["ci_high"] - c["gap"]) if c.get("ci_high") is not None else 0)
        ax.bar(xs, ys, width=width, label=name, yerr=[lo, hi], capsize=2)
    ax.axhline(0, color="black", linewidth=0.8)
    labels = [str(b["start"]) if b["start"] == b["end"] else f"{b['start']}–{b['end']}" for b in buckets]
    ax.set_xticks(range(len(buckets)), labels, fontsize=8)
    ax.set_xlabel("generated tokens of the FP32 run")
    ax.set_ylabel("accuracy change vs FP32 (points)")
    ax.set_title(f"{result.label}: {task}", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    return _png(fig)

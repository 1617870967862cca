"""kl.json (the result; schema in docs/kl_json_schema.md), and kl_buckets.csv and kl_vs_length.png rendered from it."""

from __future__ import annotations

import math
import platform
import subprocess
from pathlib import Path

import numpy as np

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kl.buckets import Bucket, bucket_stats
from replayssm_eval.kl.metrics import METRICS
from replayssm_eval.kl.store import atomic_write_bytes, atomic_write_json

SCHEMA_VERSION = 1
CSV_FILE, JSON_FILE, PLOT_FILE = "kl_buckets.csv", "kl.json", "kl_vs_length.png"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINE_STYLES = ("-", "--", "-.", ":")


def config_results(config: ReplayConfig, metrics: np.ndarray, buckets: list[Bucket], traffic: dict | None,
                   skip_reads: dict | None = None) -> dict:
    """One entry of kl.json's `configs` from its per-token metrics [D, 4, N] (METRICS order)."""
    kl, reverse_kl, top1, nll_diff = (metrics[:, i] for i in range(len(METRICS)))
    return {
        "name": config.name,
        "read": config.read,
        "recur": config.recur,
        "shared": config.shared,
        "window": config.window,
        "seed": config.seed,
        "gdn_fold": config.gdn_fold,
        "buffer_dtype": config.buffer_dtype,
        "skip_read_below": config.skip_read_below,
        "kl_mean": float(kl.mean(dtype=np.float64)),
        "reverse_kl_mean": float(reverse_kl.mean(dtype=np.float64)),
        "top1_agree": float(top1.mean(dtype=np.float64)),
        "nll_diff_mean": float(nll_diff.mean(dtype=np.float64)),
        "state_traffic": traffic,
        "skip_reads": skip_reads,
        "buckets": [bucket_stats(kl, reverse_kl, top1, nll_diff, b) for b in buckets],
    }


def reference_results(ref_nll: np.ndarray, buckets: list[Bucket]) -> dict:
    """kl.json's `reference` from the reference NLL per token [D, N]."""
    return {
        "name": ReplayConfig().name,
        "nll_mean": float(ref_nll.mean(dtype=np.float64)),
        "buckets": [
            {
                "start": b.start,
                "end": b.end,
                "count": int(ref_nll[:, b.start - 1 : b.end].size),
                "nll_mean": float(ref_nll[:, b.start - 1 : b.end].mean(dtype=np.float64)),
            }
            for b in buckets
        ],
    }


def versions() -> dict:
    """Versions of the software that produced the numbers (None where a package is absent)."""
    import torch
    import transformers

    import replayssm_eval

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": triton_version,
        "replayssm_eval": replayssm_eval.__version__,
    }


def git_state() -> dict:
    """Commit of the replayssm_eval checkout and whether it has uncommitted changes (None outside git)."""
    root = Path(__file__).resolve().parents[2]

    def git(*args):
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 else None

    try:
        commit = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        commit = status = None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def finite(obj):
    """A copy of `obj` with NaN and infinities replaced by None (JSON has no such numbers)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def write_outputs(run_dir: Path, report: dict) -> None:
    """Write kl.json, then the CSV rendered from it, and the plot once the report is complete."""
    run_dir = Path(run_dir)
    report = finite(report)
    atomic_write_json(run_dir / JSON_FILE, report)
    atomic_write_bytes(run_dir / CSV_FILE, buckets_table(report).to_csv(index=False).encode())
    if report["complete"]:
        atomic_write_bytes(run_dir / PLOT_FILE, plot_png(report))


def buckets_table(report: dict):
    """pandas DataFrame: one row per (config, bucket), the config's name first."""
    import pandas as pd

    rows = [{"config": c["name"], **b} for c in report["configs"] for b in c["buckets"]]
    return pd.DataFrame(rows)


def plot_png(report: dict) -> bytes:
    """Mean KL per bucket against generated length (log-log), one line per config with its 95% CI band."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()

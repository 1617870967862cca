"""kl.json (the result; schema in docs/kl_json_schema.md), and kl_buckets.csv and kl_vs_length.png rendered from it."""

from __future__ import annotations

from pathlib import Path

from replayssm_eval.reports.plots import kl_vs_length_png
from replayssm_eval.results.files import atomic_write_bytes, atomic_write_json
from replayssm_eval.results.kl_tables import CSV_FILE, JSON_FILE, PLOT_FILE, buckets_table
from replayssm_eval.results.provenance import finite


def write_outputs(run_dir: Path, report: dict) -> None:
    """Write kl.json, then the CSV rendered from it, and the plot once the report is complete."""
    run_dir = Path(run_dir)
    report = finite(report)
    atomic_write_json(run_dir / JSON_FILE, report)
    atomic_write_bytes(run_dir / CSV_FILE, buckets_table(report).to_csv(index=False).encode())
    if report["complete"]:
        atomic_write_bytes(run_dir / PLOT_FILE, kl_vs_length_png(report))

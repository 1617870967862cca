"""Reports rendered from result JSON only: `replayssm-eval report`.

    load.py     find and read kl.json / accuracy.json
    tables.py   per-bucket KL, accuracy gaps (the paper's GPQA layout), state traffic, Pareto points, provenance
    plots.py    matplotlib PNGs (Agg)
    render.py   the report's sections -> self-contained HTML (base64 PNGs) and Markdown (+ PNG files)
"""

from __future__ import annotations

from pathlib import Path


def render_report(paths, output, title: str = "ReplaySSM state formats") -> tuple[Path, Path]:
    """Load the results under `paths`, build the report and write it to `output`; returns (html, md) paths."""
    from replayssm_eval.reports.load import load_results
    from replayssm_eval.reports.render import build_report, write_report

    return write_report(build_report(load_results(paths), title=title), Path(output))


__all__ = ["render_report"]

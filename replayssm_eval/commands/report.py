"""`replayssm-eval report`: render KL and accuracy results as one HTML page and a Markdown file.

    replayssm-eval report reports/kl-tiny-nemotron-h-20250101T000000Z reports/kl-tiny-qwen3.5-...
    replayssm-eval report reports/example --output reports/example      # every run found below a folder
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from replayssm_eval.cli import command


@dataclass(frozen=True)
class ReportConfig:
    """Options of `replayssm-eval report` (one field per option)."""

    results: tuple[str, ...] = field(default=(), metadata={
        "positional": True, "metavar": "RESULT_DIR",
        "help": "kl / accuracy run directories, their JSON files, or folders holding run directories"})
    output: str | None = field(default=None, metadata={
        "help": "output directory for report.html, report.md and the PNGs (default reports/report-<UTC time>/)"})
    title: str = field(default="ReplaySSM state formats", metadata={"help": "the report's heading"})


@command("report")
def report_command(config: ReportConfig) -> int:
    from replayssm_eval.reports import render_report
    from replayssm_eval.results.files import check_output_dir

    if not config.results:
        raise ValueError("no result directories given; pass one or more kl / accuracy run directories")
    output = Path(config.output) if config.output else (
        Path("reports") / f"report-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}")
    check_output_dir(output)  # before any result is read
    html_path, md_path = render_report(config.results, output, title=config.title)
    print(f"wrote {html_path} and {md_path}", file=sys.stderr)
    return 0

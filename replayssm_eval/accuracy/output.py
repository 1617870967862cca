"""accuracy.json (the result; schema in docs/accuracy_json_schema.md) and accuracy.md rendered from it."""

from __future__ import annotations

from pathlib import Path

from replayssm_eval.reports.load import Result
from replayssm_eval.reports.render import accuracy_markdown
from replayssm_eval.results.accuracy_tables import JSON_FILE, MARKDOWN_FILE, accuracy_report
from replayssm_eval.results.files import atomic_write_bytes, atomic_write_json


def render(run_dir: Path, plan, header: dict) -> dict:
    """Write accuracy.json and accuracy.md from what is finished in `run_dir` (`plan`: the run's `driver.Plan`);
    returns the report."""
    options = plan.options
    report = accuracy_report(run_dir, plan.tasks, plan.configs, header, bucket_spec=options.buckets,
                             iters=options.bootstrap_iters, samples=options.samples)
    atomic_write_json(run_dir / JSON_FILE, report)
    result = Result("accuracy", run_dir / JSON_FILE, report, run_dir.name)
    atomic_write_bytes(run_dir / MARKDOWN_FILE, accuracy_markdown(result).encode())
    return report

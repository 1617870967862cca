"""Fixtures of the report tests: hand-built result directories (the reports of `tests.helpers.reports`)."""

import json

import pytest

from tests.helpers.reports import accuracy_report, kl_report


@pytest.fixture
def results_dir(tmp_path):
    """Two KL runs of two models and one accuracy run, each in its own run directory."""
    root = tmp_path / "results"
    runs = {"kl-nano": kl_report(), "kl-qwen": kl_report("qwen3.5-4b", ("shared:nvfp4", "nvfp4/fp8sr"), docs=1),
            "acc-nano": None}
    for name, report in runs.items():
        (root / name).mkdir(parents=True)
        file = "accuracy.json" if report is None else "kl.json"
        (root / name / file).write_text(json.dumps(report or accuracy_report()))
    return root

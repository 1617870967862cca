"""Known third-party noise is dropped around our calls, and only that: other records of the same loggers,
and everything outside the block, still show."""

import logging
import os
import subprocess
import sys
from pathlib import Path

from transformers.utils import logging as hf_logging

from replayssm_eval.models.quiet import quiet_logs

ROOT = Path(__file__).resolve().parents[2]


def test_quiet_logs_drops_only_the_known_lines_and_only_inside(caplog):
    logger = logging.getLogger("torchao")
    bars = hf_logging.is_progress_bar_enabled()
    with caplog.at_level(logging.WARNING, logger="torchao"):
        with quiet_logs():
            logger.warning("Failed to load /site-packages/torchao/_C_mxfp8.so: Could not load this library")
            logger.warning("torchao: something a user should see")
            assert not hf_logging.is_progress_bar_enabled()
        logger.warning("Failed to load /elsewhere.so")
    assert [r.getMessage() for r in caplog.records] == ["torchao: something a user should see",
                                                       "Failed to load /elsewhere.so"]
    assert hf_logging.is_progress_bar_enabled() == bars
    assert not logger.filters


def test_loading_and_running_a_model_prints_nothing(tmp_path):
    """In a fresh interpreter (the noise comes once per process): load a bundled model and run it."""
    code = ("import torch; from replayssm_eval.models import load_model; "
            "rm = load_model('tiny-nemotron-h', dtype='fp32'); "
            "rm.forward(torch.tensor([[1, 2, 3, 4]]), rm.new_session('nvfp4/fp16sr@2'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""

"""`replayssm-eval sensitivity`: per SSM layer (and head), the KL when only it uses a config and when only it
stays FP32.

    replayssm-eval sensitivity --model tiny-nemotron-h --config nvfp4/fp16sr --num-docs 2 --tokens 256 --device cpu
    replayssm-eval sensitivity --model tiny-qwen3.5 --config nvfp4/fp16sr --heads 2 --device cpu
    replayssm-eval sensitivity --resume reports/sensitivity-tiny-nemotron-h-20250101T000000Z
"""

from __future__ import annotations

from replayssm_eval.cli import command
from replayssm_eval.kl.options import SensitivityConfig


@command("sensitivity")
def sensitivity_command(config: SensitivityConfig) -> int:
    """Run `run_sensitivity`; Ctrl-C exits with 130 after the kl stage has said how to resume."""
    from replayssm_eval.kl.sensitivity import run_sensitivity

    try:
        run_sensitivity(config)
    except KeyboardInterrupt:
        return 130
    return 0

"""`replayssm-eval accuracy`: downstream accuracy of state formats against FP32, per FP32 length bucket.

    replayssm-eval accuracy --model nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16 --tasks gpqa_diamond,mmlu_pro,math_l5 \
        --configs fp32,shared:nvfp4,nvfp4/fp16sr,nvfp4/fp8sr --chat-template
    replayssm-eval accuracy --model tiny-qwen3.5 --data fixtures --limit 4 --max-gen-toks 64   # offline
    replayssm-eval accuracy ... --output reports/acc-run   # run again with the same options: resumes
    replayssm-eval accuracy ... --gen-kwargs temperature=0.6,top_p=0.95,top_k=20 --samples 8   # sampled, avg@8

`accuracy.driver` describes the run and its files.
"""

from __future__ import annotations

from replayssm_eval.accuracy.driver import run_accuracy
from replayssm_eval.accuracy.options import AccuracyConfig
from replayssm_eval.cli import command


@command("accuracy")
def accuracy_command(config: AccuracyConfig) -> int:
    path = run_accuracy(config)
    print(path if config.export_requests else path / "accuracy.md")
    return 0

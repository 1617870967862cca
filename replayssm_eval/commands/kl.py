"""`replayssm-eval kl`: teacher-forced KL of state formats against the FP32-state reference.

    replayssm-eval kl                                        # tiny-nemotron-h, bundled text, default configs
    replayssm-eval kl --model nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16 --read nvfp4 --recur fp16sr
    replayssm-eval kl --dataset pg19 --tokens 131072 --config shared:nvfp4 --config nvfp4/fp32
    torchrun --nproc-per-node 8 --shutdown-timeout 600 -m replayssm_eval.cli kl --dataset pg19 --num-docs 16 ...
    replayssm-eval kl --resume reports/kl-tiny-nemotron-h-20250101T000000Z

On Ctrl-C, torchrun forwards the signal to the ranks and kills them after its `--shutdown-timeout`
(default 30 s); each rank first finishes its segment (minutes at 128K tokens on a large model), so
raise that torchrun option for the snapshot to be written.
"""

from __future__ import annotations

from replayssm_eval.cli import command
from replayssm_eval.kl.options import KLConfig


@command("kl")
def kl_command(config: KLConfig) -> int:
    """Run `run_kl`; Ctrl-C exits with 130 after the driver has said how to resume."""
    from replayssm_eval.kl.driver import run_kl

    try:
        run_kl(config)
    except KeyboardInterrupt:
        return 130
    return 0

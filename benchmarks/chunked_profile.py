"""Where a chunked call's time goes: wall time per call against the chunked kernel's GPU time, by batch and config.

    python benchmarks/chunked_profile.py --family mamba2 --out out/chunked_profile.json     # H200: about a minute
    ncu --kernel-name regex:_chunk --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section SchedulerStats --section LaunchStats \\
        python benchmarks/chunked_profile.py --family mamba2 --once fp32/fp32@16            # one launch, for Nsight Compute
    TRITON_INTERPRET=1 python benchmarks/chunked_profile.py --tiny --device cpu --tokens 32 --batches 1   # smoke run

One SSM layer at its full-size geometry (benchmarks/kernel_speed.py), `--tokens` teacher-forced tokens per call, as
the KL driver calls `chunked(..., backend="triton")`. Per (batch, config): the wall time of a call (mean of three,
after an untimed one), the GPU time of the chunked Triton kernel (`_chunk_scan_kernel`, `_chunked_kernel`; torch
profiler) and of every GPU operation of the call. How the kernel's time grows with the batch (waves of programs) and
with the window (the `@L` of a config) tells latency from throughput; `--once` runs three calls and nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from kernel_speed import BENCHES, Rand, Timer, driver_geometry, environment  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from replayssm_eval.generate import split_configs  # noqa: E402

CONFIGS = "fp32/fp32@16,nvfp4:scale=row/fp16sr@16,nvfp4/fp16sr@16,fp32/fp32@4,fp32/fp32@64"


def measure(fam, inputs, config: str, timer: Timer) -> dict:
    """Wall ms of one call (mean of three after a warm-up) and the GPU ms of its chunked kernel and of all its ops."""
    call = lambda: fam.chunked(inputs, config, "triton")  # noqa: E731
    call()
    wall_ms = timer.wall_s(lambda: [call() for _ in range(3)]) / 3 * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        timer.wall_s(call)
    events = prof.key_averages()
    return dict(wall_ms=wall_ms, kernel_ms=sum(e.self_device_time_total for e in events if e.key.startswith("_chunk")) / 1e3,
                gpu_ms=sum(e.self_device_time_total for e in events) / 1e3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="mamba2", choices=sorted(BENCHES))
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--once", metavar="CONFIG", help="three calls of this config at batch 1 and nothing else")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    fam = BENCHES[args.family](driver_geometry(args.family, args.tiny), Rand(args.device, seed=0))
    timer = Timer(args.device, quick=True)
    if args.once:
        inputs = fam.sequence(args.tokens)
        timer.wall_s(lambda: [fam.chunked(inputs, args.once, "triton") for _ in range(3)])
        return
    rows = []
    for batch in map(int, args.batches.split(",")):
        inputs = fam.sequence(args.tokens, batch)
        for config in split_configs(args.configs):
            row = dict(family=args.family, batch=batch, tokens=args.tokens, config=config,
                       **measure(fam, inputs, config, timer))
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": environment(args.device), "args": vars(args), "rows": rows},
                                             indent=2))


if __name__ == "__main__":
    main()

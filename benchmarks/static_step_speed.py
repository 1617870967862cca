"""The fixed-buffer decode step (`kernels.static_step`, what `--step graph` captures) per fold variant, and what rows
out of window phase cost: the engine's case.

    python benchmarks/static_step_speed.py --out out/static_step.json                  # H200: about a minute
    TRITON_INTERPRET=1 python benchmarks/static_step_speed.py --tiny --device cpu       # CPU: checks the script runs

One SSM layer at full-size geometry (`kernel_speed.py`'s drivers: GDN of Qwen3.5-4B, Mamba-2 of Nemotron-3-Nano-4B,
KDA of Kimi-Linear-48B-A3B), batch 256, per config, `StaticState.step_device` timed as `--step graph` runs it,
replayed from a CUDA graph (`triton.testing.do_bench_cudagraph`, median: no host launch overhead), in its three
variants: no row folds ("none"), every row folds ("all": rows in phase, a fixed batch's flush), and rows spread over
every window phase ("some": 1/L of them fold at every step, as rows that joined at different times do in the
engine). A window of L tokens then costs (L - 1) x none + all on a fixed batch and L x some in
the engine; the table gives both per token and their ratio. `--profile` prints the "some" step's GPU kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

from kernel_speed import BENCHES, Rand, driver_geometry  # noqa: E402
from replayssm_eval.generate import split_configs  # noqa: E402
from replayssm_eval.kernels.static_step import StaticState  # noqa: E402
from replayssm_eval.replay.config import ReplayConfig  # noqa: E402

CONFIGS = ("nvfp4:scale=head/fp16sr@16", "nvfp4:scale=row/fp16sr@16", "fp32")


def step_inputs(fam, batch: int) -> tuple:
    """One token's inputs in `KernelFamily.inputs` order with T = 1."""
    if fam.name == "mamba2":
        x, dt, b, c = fam.token(batch, 1)
        return x, dt, fam.A, b, c, fam.D
    return fam.token(batch, 1)


def static_state(fam, batch: int, config: str, counts: list[int]) -> StaticState:
    """A layer's StaticState whose rows sit at window phases `counts`."""
    cfg = ReplayConfig.parse(config)
    state = fam.replay_state(fam.fp32_state(batch), config, 0)
    static = StaticState.from_replay_state(fam.name, state, state.lo_packed, cfg, counts)
    static.count.copy_(torch.tensor(counts))
    return static


def time_variant(fam, batch: int, config: str, variant: str, device: str) -> tuple[float, StaticState, tuple]:
    """Median ms of one `step_device` call of `variant` replayed from a CUDA graph, its rows' phases reset before each
    call."""
    window = ReplayConfig.parse(config).window
    counts = {"none": [0] * batch, "all": [window - 1] * batch, "some": [b % window for b in range(batch)]}[variant]
    static = static_state(fam, batch, config, counts)
    inputs = tuple(t.contiguous() for t in step_inputs(fam, batch))
    start = static.count.clone()

    def step():
        static.count.copy_(start)
        static.step_device(inputs, static.folds_next)

    if device == "cpu":
        step()
        return float("nan"), static, inputs
    return triton.testing.do_bench_cudagraph(step, rep=60, return_mode="median"), static, inputs


def profile(static: StaticState, inputs: tuple, steps: int = 16) -> str:
    """The "some" step's GPU time per kernel over `steps` calls."""
    start = static.count.clone()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            static.count.copy_(start)
            static.step_device(inputs, static.folds_next)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="device_time_total", row_limit=14, max_name_column_width=60)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="gdn,mamba2,kda")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the drivers' tiny shapes (CPU checks of the script)")
    parser.add_argument("--profile", action="store_true", help="print the 'some' step's kernels per family and config")
    parser.add_argument("--out", help="JSON file of the rows")
    args = parser.parse_args(argv)
    batch = 4 if args.tiny else args.batch
    rows = []
    print(f"{'family':7} {'config':28} {'none ms':>8} {'some ms':>8} {'all ms':>8} {'fixed/token':>11} "
          f"{'engine/token':>12} {'engine/fixed':>12}", flush=True)
    for name in args.families.split(","):
        fam = BENCHES[name](driver_geometry(name, args.tiny), Rand(args.device))
        for config in split_configs(args.configs):
            window = ReplayConfig.parse(config).window
            ms, last = {}, None
            for variant in ("none", "some", "all") if window > 1 else ("all",):
                ms[variant], static, inputs = time_variant(fam, batch, config, variant, args.device)
                if variant == "some":
                    last = static, inputs
            if window == 1:
                ms["none"] = ms["some"] = ms["all"]
            fixed = ((window - 1) * ms["none"] + ms["all"]) / window
            row = dict(family=name, config=config, batch=batch, window=window, **ms, fixed_per_token=fixed,
                       engine_per_token=ms["some"], engine_over_fixed=ms["some"] / fixed)
            rows.append(row)
            print(f"{name:7} {config:28} {ms['none']:8.3f} {ms['some']:8.3f} {ms['all']:8.3f} {fixed:11.3f} "
                  f"{ms['some']:12.3f} {row['engine_over_fixed']:11.2f}x", flush=True)
            if args.profile and last is not None and args.device != "cpu":
                print(profile(*last), flush=True)
            torch.cuda.empty_cache() if args.device != "cpu" else None
    if args.out:
        Path(args.out).write_text(json.dumps(dict(rows=rows, device=torch.cuda.get_device_name() if args.device != "cpu"
                                                  else "cpu", torch=torch.__version__, triton=triton.__version__),
                                             indent=1))


if __name__ == "__main__":
    main()

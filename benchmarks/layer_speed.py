"""Teacher-forced throughput of one SSM layer, full-size geometries: our chunked form against HF's FP32 torch scan.

    python benchmarks/layer_speed.py --out out/layer_speed.json         # H200: Mamba-2 and GDN, about 2 minutes
    python benchmarks/layer_speed.py --families kda --out out/layer_speed_kda.json   # KDA, about 1-2 minutes
    python benchmarks/layer_speed.py --sweep nvfp4:scale=row/fp16sr@16 --profile   # + launch sweep, top CUDA kernels
    python benchmarks/layer_speed.py --families gdn --sweep stepquant:dualaxis6 \
        --launches '{"gdn": [{"BV": 16, "num_warps": 8, "DOT": "tf32x3"}]}'       # only the launches given
    TRITON_INTERPRET=1 python benchmarks/layer_speed.py --tiny --device cpu --tokens 64 --segment 32   # smoke run
    python benchmarks/layer_speed.py --save-outputs a.pt; (cd OTHER && PYTHONPATH=$PWD \
        python $OLDPWD/benchmarks/layer_speed.py --compare-outputs $OLDPWD/a.pt)   # a kernel change: the same bits?

The KL driver feeds every SSM layer segments of `--segment` tokens and carries the state between
them; this times exactly that per layer (batch 1, inputs prepared once, one warm-up segment first
so that Triton compiles are not timed). Rows:
  hf torch scan   the function a plain HF forward runs (`mamba2_chunk_scan` / `torch_chunk_gated_delta_rule` /
                  `chunk_kimi_delta_attention`, FP32 state), the yardstick; the `fp32` reference of the KL driver
                  runs exactly this
  chunked         `chunked(..., backend)` per config; triton configs fall back to torch where a format's
                  rounding needs a reduction the kernel cannot do (the note says so)
  compare         --compare-outputs: the first segment's output and stored copies against those saved by
                  --save-outputs from another checkout (same seeded inputs)
  sweep           the triton configs under other launch configs (`chunked_launch_config` of each family; Mamba-2's
                  configs that run in phases `triton_phases.phase_launch_config`, its one-token windows
                  `triton_tokens.token_launch_config`), with
                  the first segment's output error and the share of stored checkpoint elements that differ
                  from the default launch (tf32x3 products are not bit-identical to FP32 FMAs)
Geometries as benchmarks/kernel_speed.py: Mamba-2 of Nemotron-3-Nano-4B, GDN of Qwen3.5-4B, KDA of Kimi-Linear-48B-A3B.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import sys
import warnings
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from kernel_speed import BENCHES, Rand, Timer, driver_geometry, environment, relerr  # noqa: E402

from replayssm_eval.formats.codec import Group, tile_codec  # noqa: E402
from replayssm_eval.generate import split_configs  # noqa: E402
from replayssm_eval.kernels.delta import triton_chunk as delta_triton  # noqa: E402
from replayssm_eval.kernels.mamba2 import triton_chunk as mamba2_triton  # noqa: E402
from replayssm_eval.kernels.mamba2 import triton_phases as mamba2_phases  # noqa: E402
from replayssm_eval.kernels.mamba2 import triton_tokens as mamba2_tokens  # noqa: E402
from replayssm_eval.replay.config import ReplayConfig  # noqa: E402

CONFIGS = ("nvfp4:scale=head/fp16sr@16", "nvfp4:scale=row/fp16sr@16", "shared:nvfp4:scale=head@16",
           "shared:fp8@16", "nvfp4/fp16sr@16")
PRECISIONS = ("ieee", "tf32x3")
SWEEP = {  # launch configs tried per family (the whole-head ones only where a scale group needs them: `whole_head`)
    "mamba2": [dict(BLOCK_P=16, num_warps=w, DOT="ieee", READ_DOT=d, maxnreg=r)
               for w, d, r in itertools.product((2, 4), PRECISIONS, (None, 128))],
    "gdn": [dict(BV=v, num_warps=w, DOT="tf32x3")  # "ieee" measured 1.9x slower (BENCHMARKS.md, Chunked form)
            for v, w in itertools.product((16, 32, 64), (4, 8))],
    "kda": [dict(BV=v, num_warps=w, DOT="tf32x3") for v, w in itertools.product((16, 32, 64), (4, 8))],
}
WHOLE_HEAD = {"mamba2": [dict(BLOCK_P=128, num_warps=w, DOT="ieee", READ_DOT=d, maxnreg=None)
                         for w, d in itertools.product((4, 8, 16, 32), PRECISIONS)],
              "gdn": [dict(BV=128, num_warps=w, DOT="tf32x3") for w in (4, 8, 16, 32)],
              "kda": [dict(BV=128, num_warps=w, DOT="tf32x3") for w in (4, 8, 16, 32)]}
# Mamba-2 configs that run in phases (`triton_phases.phased`): warps of the fold programs and of the output programs
PHASES = [dict(fold_warps=f, output_warps=o) for f, o in itertools.product((2, 4), (2, 4))]
# Mamba-2 configs of one-token windows that run the token scan (`triton_tokens.token_launch_config`)
# (registers per thread capped so that more programs stay resident: each runs the call's whole chain of folds)
TOKENS = [dict(num_warps=w, maxnreg=r) for w, r in ((4, 128), (8, None), (8, 64), (8, 80), (8, 96), (8, 128), (16, 64))]


def hf_scan(family: str):
    """HF's FP32 torch scan of the family, unwrapped from transformers' kernel-hub selection."""
    if family == "mamba2":
        from transformers.models.nemotron_h import modeling_nemotron_h as m

        return inspect.unwrap(m.mamba2_chunk_scan)
    if family == "kda":
        from transformers.models.kimi_linear import modeling_kimi_linear as m

        return inspect.unwrap(m.chunk_kimi_delta_attention)
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    return inspect.unwrap(m.torch_chunk_gated_delta_rule)


def hf_runner(fam, inputs):
    """A function running HF's scan over `inputs` segment by segment, carrying the FP32 state."""
    scan = hf_scan(fam.name)
    if fam.name == "mamba2":
        x, dt, A, B, C, D, s0 = inputs

        def step(sl, state):
            return scan(x[:, sl], dt[:, sl], A, B[:, sl], C[:, sl], 256, D=D, initial_states=state, return_final_states=True)
    else:
        q, k, v, g, beta, s0 = inputs
        rep = fam.HV // fam.H  # transformers 5.17 repeats q, k to the value heads before the call; 5.24 takes either
        q, k = q.repeat_interleave(rep, 2) * fam.K ** 0.5, k.repeat_interleave(rep, 2)  # HF scales q itself

        # the KDA layer asks its scan to L2-normalise q, k (a no-op on these unit vectors, timed as HF runs it)
        norm = {"use_qk_l2norm_in_kernel": True} if fam.name == "kda" else {}

        def step(sl, state):
            return scan(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], initial_state=state, output_final_state=True,
                        **norm)
    return step, s0


def whole_head(config: str) -> bool:
    """Whether a config's in-loop copies need programs that hold the whole head: scale groups of more rows than the
    sweep's smallest row blocks (16), as head scales and SGLang's 32-row tiles, and dual-axis factors (whose codec
    `tile_codec` gives only with the head's dims)."""
    cfg = ReplayConfig.parse(config)
    formats = (cfg.recur_format, cfg.read_format)
    dual = any(f.kernel_codec is not None and f.kernel_codec.group == Group.DUAL for f in formats)
    return dual or any(c is not None and c.spans(16) for c in map(tile_codec, formats))


def phased(family: str, config: str, geo: dict) -> bool:
    """Whether a config runs Mamba-2's phases at the geometry geo (its launch: `triton_phases.phase_launch_config`)."""
    return family == "mamba2" and mamba2_triton.runs_in_phases(ReplayConfig.parse(config).plain(), (geo["P"], geo["N"]))


def per_token(family: str, config: str, geo: dict, device: str) -> bool:
    """Whether a config runs Mamba-2's token scan (`triton_tokens`) at the geometry geo on device."""
    cfg = ReplayConfig.parse(config).plain()
    if family != "mamba2" or cfg.window != 1:
        return False
    return mamba2_triton.token_scan_rows(cfg, (geo["P"], geo["N"]), 1, torch.device(device)) is not None


def launches(family: str, config: str, geo: dict, device: str, chosen: dict) -> list[dict]:
    """The launch configs the sweep tries for a config: chosen[family] where given (`--launches`), else by its path."""
    if family in chosen:
        return chosen[family]
    if per_token(family, config, geo, device):
        return TOKENS
    if phased(family, config, geo):
        return PHASES
    if not whole_head(config):
        return SWEEP[family]
    # GDN and KDA: a head scale or dual-axis factors may also span narrower programs that exchange them
    return WHOLE_HEAD[family] + (SWEEP[family] if family in ("gdn", "kda") else [])


def ours_runner(fam, inputs, config: str, backend: str):
    *data, s0 = inputs

    def step(sl, state):
        return fam.chunked((*(t[:, sl] if t.dim() > 1 else t for t in data), state), config, backend)
    return step, s0


def time_segments(step, s0, tokens: int, segment: int, timer: Timer) -> tuple[float, tuple, str]:
    """Seconds for `tokens` tokens in segments, after one untimed warm-up segment from s0; also that warm-up
    segment's (output, state) and the fallback warnings it raised ("" if none)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = step(slice(0, segment), s0)
    note = "; ".join(str(w.message) for w in caught if "falls back" in str(w.message) or "runs the torch" in str(w.message))

    def segments():
        state = s0
        for a in range(0, tokens, segment):
            _, state = step(slice(a, min(a + segment, tokens)), state)
    return timer.wall_s(segments), first, note


def with_launch(family: str, config: str, geo: dict, launch: dict, device: str):
    """Context: the family's chunked kernels launched with `launch` instead of their default config."""
    if per_token(family, config, geo, device):
        default = mamba2_tokens.token_launch_config
        return mock.patch.object(mamba2_tokens, "token_launch_config", lambda *args: {**default(*args), **launch})
    if phased(family, config, geo):
        default = mamba2_phases.phase_launch_config
        return mock.patch.object(mamba2_phases, "phase_launch_config", lambda *args: {**default(*args), **launch})
    if family == "mamba2":
        return mock.patch.object(mamba2_triton, "chunked_launch_config", lambda *args: dict(launch))

    def delta_launch_config(dk: int, dv: int, whole_head: bool, bv: int = 0) -> dict:
        if whole_head and launch["BV"] < dv:  # e.g. a head scale whose programs cannot all run at once to exchange it
            raise ValueError(f"BV={launch['BV']} does not hold the head's {dv} columns, as this call's copies need")
        return dict(launch)
    return mock.patch.object(delta_triton, "chunked_launch_config", delta_launch_config)


def differences(base, other) -> dict:
    """One segment under another launch config vs the default: output error and stored-checkpoint flips."""
    (y0, s0), (y1, s1) = base, other
    return {"y_max_rel_err": relerr(y0, y1),
            "hi_differs": float((s1.hi != s0.hi).float().mean()), "lo_differs": float((s1.lo != s0.lo).float().mean())}


def profile_table(step, s0, segment: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(slice(0, segment), s0)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=10)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="mamba2,gdn")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--segment", type=int, default=2048)
    ap.add_argument("--sweep", default="", help="comma-separated configs whose launch configs are swept")
    ap.add_argument("--launches", type=json.loads, default={},
                    help='the sweep\'s launch configs of some families, as JSON: {"gdn": [{"BV": 16, "num_warps": 8, '
                         '"DOT": "tf32x3"}], "mamba2": []} (the others: every config of the path they run)')
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--save-outputs", help="save each config's first segment (output, S_hi, S_lo) to this file")
    ap.add_argument("--compare-outputs", help="compare each config's first segment with this --save-outputs file")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    timer = Timer(args.device, quick=True)
    rows = []
    saved, earlier = {}, torch.load(args.compare_outputs) if args.compare_outputs else {}

    def record(**row):
        row["tokens_per_s"] = row["tokens"] / row["seconds"] if row.get("seconds") else None
        rows.append(row)
        print(json.dumps(row), flush=True)

    for family in args.families.split(","):
        geo = driver_geometry(family, args.tiny)
        fam = BENCHES[family](geo, Rand(args.device, seed=0))
        inputs = fam.sequence(args.tokens)
        step, s0 = hf_runner(fam, inputs)
        record(family=family, path="hf torch scan", config="fp32", tokens=args.tokens,
               seconds=time_segments(step, s0, args.tokens, args.segment, timer)[0])
        for config in split_configs(args.configs):
            step, s0 = ours_runner(fam, inputs, config, "triton")
            seconds, base, note = time_segments(step, s0, args.tokens, args.segment, timer)
            record(family=family, path="chunked triton", config=config, tokens=args.tokens, note=note, seconds=seconds)
            outputs = {"y": base[0].cpu(), "hi": base[1].hi.cpu(), "lo": base[1].lo.cpu()}  # seeded inputs
            saved[f"{family} {config}"] = outputs
            if f"{family} {config}" in earlier:
                before = earlier[f"{family} {config}"]
                record(family=family, path="compare", config=config, tokens=args.segment,
                       **{f"{name}_differs": float((outputs[name] != before[name]).float().mean()) for name in outputs},
                       y_max_rel_err=relerr(before["y"], outputs["y"]))
            if args.profile and timer.cuda:
                print(profile_table(step, s0, args.segment), flush=True)
            if config in split_configs(args.sweep) and not note:
                for launch in launches(family, config, geo, args.device, args.launches):
                    with with_launch(family, config, geo, launch, args.device):
                        try:
                            seconds, first, _ = time_segments(step, s0, args.segment * 2, args.segment, timer)
                            diff = differences(base, first)
                        except Exception as err:  # an out-of-resources launch config is a row, not a stop
                            record(family=family, path="sweep", config=config, launch=launch, tokens=2 * args.segment,
                                   error=f"{type(err).__name__}: {str(err)[:200]}")
                            continue
                    record(family=family, path="sweep", config=config, launch=launch, tokens=2 * args.segment,
                           seconds=seconds, **diff)
    if args.save_outputs:
        torch.save(saved, args.save_outputs)
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": environment(args.device), "args": vars(args), "rows": rows},
                                             indent=2))


if __name__ == "__main__":
    main()

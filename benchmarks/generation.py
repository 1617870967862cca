"""Generation speed of the accuracy engine on full-size architectures with random weights.

    python benchmarks/generation.py --out OUT                 # on a GPU: everything below, both 4B models
    python benchmarks/generation.py --out OUT --scale 8       # GPQA workload with lengths / 8 (time x 8 estimated)
    python benchmarks/generation.py --out OUT --steps triton,graph   # both decode steps, one table
    python benchmarks/generation.py --tiny --quick --device cpu --out OUT   # CPU smoke run on the tiny fixtures

Models: Qwen3.5-4B and Nemotron-3-Nano-4B built from `presets.full_size_config` (random weights,
bf16, no download; `--tiny`: the bundled fixtures in fp32). Parts (`--parts`):

- decode: `prompt_len`-token prompts, `new_tokens` new tokens per row (eos ignored), one batch of
  `--batches` rows, configs `--configs` through `engine.Engine` with each decode step of `--steps`
  (auto: triton on cuda, reference on cpu; graph: the whole model's step as a CUDA graph, its
  first uses and captures inside the timed call) and plain HF `generate` (the unrouted model,
  `min_new_tokens` forcing the length); tokens/s over the whole call (prefill included) after an
  untimed warm-up of the same batch (`warm_up_tokens`: every step variant compiled). Also the same call
  with `--first-tokens` new tokens: `first_seconds`, what a user waits before the steady state (prefill,
  captures, the first steps), and the engine's time per step past them (`step_ms`: the
  difference over the other steps), which the profile part's fixed-batch step compares with;
  `step_host_ms`: the host's time launching a step (graph: a replay), which the device overlaps.
  `--profile-decode` runs the timed call under torch.profiler: its GPU kernel seconds against its
  wall seconds, and its top kernels (OUT/decode_<model>_<config>_b<batch>_<step>_first<n>.txt).
- prefill: `--prefill-rows` x `--prefill-len` prompts through `Engine.prefill` (segments of
  `--prefill-segment`, at most `--prefill-tokens` tokens per call): seconds and peak memory.
- gpqa: 198 prompts of `prompt_len` tokens, generation lengths drawn log-normally (median 4096,
  sigma GPQA_SIGMA, cap 32768, seed 0) and divided by `--scale`, every row forced to its length;
  wall time per config with continuous and with static batching (`--batching`) of `--gpqa-batch` rows,
  after an untimed warm-up call whose rows stop at every phase of two windows (every step variant compiled). The
  full-size time is estimated as the measured time x scale (decode dominates; attention's KV
  grows with the length, so this is a lower bound).
- profile: per batch and config, a running batch of the first step: ms per one-token step (graph:
  replays) and torch.profiler over `--profile-steps` steps (whole windows; graph: run eagerly, the
  same kernels, since the profiler does not see inside a graph): the top ops by GPU and CPU time.

Prints one table and writes OUT/generation.json (plus OUT/profile_<model>_<config>_b<batch>.txt).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from replayssm_eval.generate import split_configs
from replayssm_eval.generate.engine import Engine
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.models import ReplayModel, load_model
from replayssm_eval.models.model_graph import StaticDecoder
from replayssm_eval.models.presets import full_size_config

FULL_SIZE = ("qwen3.5-4b", "nemotron-3-nano-4b")
TINY = ("tiny-qwen3.5", "tiny-nemotron-h")
CONFIGS = ("fp32", "nvfp4:scale=head/fp16sr")
GPQA_PROMPTS, GPQA_MEDIAN, GPQA_SIGMA, GPQA_CAP = 198, 4096, 1.0, 32768
PARTS = ("decode", "prefill", "gpqa", "profile")


def build(name: str, device: str) -> ReplayModel:
    if name not in FULL_SIZE:
        return load_model(name, dtype="fp32", device=device, backend="triton" if device.startswith("cuda") else "torch")
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(full_size_config(name), dtype=torch.bfloat16)
    return ReplayModel(model, backend="triton")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def random_prompts(rm: ReplayModel, rows: int, length: int, seed: int) -> list[list[int]]:
    vocab = rm.model.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (rows, length), generator=g).tolist()


def gpqa_lengths(scale: float, count: int = GPQA_PROMPTS) -> list[int]:
    """Forced generation lengths of the GPQA-shaped workload (see the module docstring), divided by `scale`."""
    g = torch.Generator().manual_seed(0)
    drawn = torch.exp(math.log(GPQA_MEDIAN) + GPQA_SIGMA * torch.randn(count, generator=g, dtype=torch.float64))
    return [max(1, int(min(x, GPQA_CAP) / scale)) for x in drawn.tolist()]


def timed_generate(engine: Engine, prompts, lengths, device: str) -> float:
    sync(device)
    start = time.perf_counter()
    engine.generate(prompts, max_gen_toks=lengths, seq_ids=list(range(len(prompts))))
    sync(device)
    return time.perf_counter() - start


def decode_rows(rm, name, args, out: Path, emit) -> None:
    for batch in args.batches:
        prompts = random_prompts(rm, batch, args.prompt_len, 1)
        for config in args.configs:
            for step in args.steps:
                engine = Engine(rm, config, step=step, max_batch=batch, prefill_segment=args.prefill_segment,
                                prefill_tokens=args.prefill_tokens, stop_at_eos=False)
                timed_generate(engine, prompts, warm_up_tokens(config), args.device)  # Triton compiles
                release(args.device)
                first = None
                if args.first_tokens:
                    first = timed_generate(engine, prompts, args.first_tokens, args.device)
                    release(args.device)  # the short run's decoder and graphs
                reset_peak(args.device)
                steps, regroups, retries = engine.decode_steps, engine.regroups, alloc_retries(args.device)
                trace = out / f"decode_{name}_{slug(config)}_b{batch}_{step}_first{args.first_tokens}.txt"
                host = host_step_seconds(engine)
                seconds, gpu_s = timed_call(lambda: timed_generate(engine, prompts, args.new_tokens, args.device),
                                            args.device, trace if args.profile_decode else None)
                emit({"part": "decode", "model": name, "batch": batch, "config": config, "step": step,
                      "seconds": seconds, "tokens_per_s": batch * args.new_tokens / seconds, "first_seconds": first,
                      "step_ms": None if first is None else 1e3 * (seconds - first) / (args.new_tokens - args.first_tokens),
                      "decode_steps": engine.decode_steps - steps, "regroups": engine.regroups - regroups,
                      "step_host_ms": 1e3 * sum(host) / max(1, len(host)),  # launching a step (graph: a replay)
                      "max_batch_after": engine.max_batch,  # below batch: the engine ran out of memory and halved it
                      "alloc_retries": alloc_retries(args.device) - retries,  # the caching allocator freed and retried
                      "gpu_kernel_s": gpu_s, "peak_gib": peak(args.device)})
                del engine
                release(args.device)


def warm_up_tokens(config: str) -> int:
    """New tokens of a warm-up call that runs every step variant (two windows: the reading steps and a flush, each
    eager and captured): Triton compiles a variant's kernels at its first launch at a batch size, about 12 s for the
    flush of Qwen3.5-4B at batch 256."""
    return 2 * ReplayConfig.parse(config).window + 2


def host_step_seconds(engine: Engine) -> list[float]:
    """The host seconds of each later `engine.step_tokens` call (its launch: the device runs on), filled as it runs."""
    step, seconds = engine.step_tokens, []

    def timed(session, tokens):
        start = time.perf_counter()
        logits = step(session, tokens)
        seconds.append(time.perf_counter() - start)
        return logits

    engine.step_tokens = timed
    return seconds


def timed_call(run, device: str, trace: Path | None) -> tuple[float, float | None]:
    """(run()'s result, the GPU kernel seconds it took) with `trace` (a path: under torch.profiler, whose top kernels
    and operators by GPU and CPU time go there), else (run(), None)."""
    if trace is None:
        return run(), None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile as run_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with run_profile(activities=activities) as prof:
        result = run()
    averages = prof.key_averages()
    gpu_s = sum(e.self_device_time_total for e in averages if e.device_type == DeviceType.CUDA) / 1e6
    text = [f"# {result:.2f} s wall, {gpu_s:.2f} s of GPU kernels"]
    if device.startswith("cuda"):
        text += ["## by GPU time (self)", averages.table(sort_by="self_device_time_total", row_limit=30)]
    text += ["## by CPU time", averages.table(sort_by="cpu_time_total", row_limit=20)]
    trace.write_text("\n".join(text) + "\n")
    return result, gpu_s


def slug(config: str) -> str:
    return config.replace("/", "_").replace(":", "_").replace("=", "")


def hf_rows(rm, name, args, emit) -> None:
    """Plain HF generate on the unrouted model (the hooks are removed: run it last)."""
    rm.remove()
    for batch in args.batches:
        ids = torch.tensor(random_prompts(rm, batch, args.prompt_len, 1), device=args.device)
        with torch.no_grad():
            rm.model.generate(ids[:2], max_new_tokens=4, min_new_tokens=4, do_sample=False)
            sync(args.device)
            start = time.perf_counter()
            rm.model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
            sync(args.device)
        seconds = time.perf_counter() - start
        emit({"part": "decode", "model": name, "batch": batch, "config": "HF generate", "seconds": seconds,
              "tokens_per_s": batch * args.new_tokens / seconds, "peak_gib": peak(args.device)})


def prefill_rows(rm, name, args, emit) -> None:
    prompts = random_prompts(rm, args.prefill_rows, args.prefill_len, 2)
    engine = Engine(rm, "fp32", step=args.steps[0], max_batch=args.prefill_rows, prefill_segment=args.prefill_segment,
                    prefill_tokens=args.prefill_tokens)
    reset_peak(args.device)
    sync(args.device)
    start = time.perf_counter()
    with torch.no_grad():
        engine.prefill(prompts, list(range(len(prompts))))
    sync(args.device)
    seconds = time.perf_counter() - start
    emit({"part": "prefill", "model": name, "batch": args.prefill_rows, "config": f"{args.prefill_len}-token prompts",
          "seconds": seconds, "tokens_per_s": args.prefill_rows * args.prefill_len / seconds, "peak_gib": peak(args.device)})


def gpqa_rows(rm, name, args, emit) -> None:
    lengths = gpqa_lengths(args.scale, args.gpqa_prompts)
    prompts = random_prompts(rm, len(lengths), args.prompt_len, 3)
    for config in args.configs:
        for step in args.steps:
            for batching in args.batching.split(","):
                continuous = batching == "continuous"
                engine = Engine(rm, config, step=step, max_batch=args.gpqa_batch, prefill_segment=args.prefill_segment,
                                prefill_tokens=args.prefill_tokens, continuous=continuous, stop_at_eos=False)
                span = warm_up_tokens(config)
                warm = [1 + k % span for k in range(min(len(prompts), args.gpqa_batch * 3 // 2))]  # out of phase
                timed_generate(engine, prompts[:len(warm)], warm, args.device)  # Triton compiles every step variant
                release(args.device)
                reset_peak(args.device)
                admitted = lambda: getattr(engine, "admitted", 0)  # noqa: E731 (0: an engine before free places, PREV)
                counts = engine.decode_steps, engine.regroups, admitted()  # the warm-up's, left out below
                seconds = timed_generate(engine, prompts, lengths, args.device)
                emit({"part": "gpqa", "model": name, "batch": args.gpqa_batch, "config": config, "step": step,
                      "batching": batching, "seconds": seconds,
                      "tokens_per_s": sum(lengths) / seconds, "estimated_full_s": seconds * args.scale,
                      "decode_steps": engine.decode_steps - counts[0], "regroups": engine.regroups - counts[1],
                      "admitted": admitted() - counts[2],
                      "max_batch_after": engine.max_batch,  # below the batch: it ran out of memory and halved it
                      "peak_gib": peak(args.device)})
                del engine
                release(args.device)


def profile(rm, name, args, out: Path, emit) -> None:
    """Per batch and config: ms per one-token step of a running batch (step graph: replays of its captured
    graphs) and the top ops of `--profile-steps` steps by GPU and CPU time. Kernels inside a CUDA graph are
    not seen by the profiler, so step graph is profiled with its decoder running eagerly: the same launches. A
    batch the device cannot hold gives a row with the error, and the other batches and configs still run."""
    for batch in args.batches:
        for config in args.configs:
            try:
                profile_one(rm, name, batch, config, args, out, emit)
            except torch.OutOfMemoryError as err:
                emit({"part": "profile", "model": name, "batch": batch, "config": config, "step": args.steps[0],
                      "error": f"OutOfMemoryError: {str(err).splitlines()[0]}"})
            release(args.device)


def profile_one(rm, name, batch, config, args, out: Path, emit) -> None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile as run_profile

    from replayssm_eval.generate.decode import decode_session

    step = args.steps[0]
    reset_peak(args.device)
    engine = Engine(rm, config, step=step, max_batch=batch, prefill_segment=args.prefill_segment,
                    prefill_tokens=args.prefill_tokens)
    window = ReplayConfig.parse(config).window
    warm = 2 * window + 1  # every variant's first use (and, graph, capture)
    timed = window * max(1, args.profile_steps // window)  # whole windows: the flush steps in their share
    with torch.no_grad():
        prefill, logits = engine.prefill(random_prompts(rm, batch, args.prompt_len, 4), list(range(batch)))
        session = decode_session(rm, config, list(range(batch)), "triton" if step == "graph" else step)
        session.continue_from(prefill.carried())
        del prefill
        logits = engine.step_tokens(session, logits.argmax(-1))
        if step == "graph":  # the engine's running batch: a decoder continuing the rows
            session = StaticDecoder.from_session(rm, session, steps=warm + 2 * timed, graphs=engine.graphs)
        for _ in range(warm):
            logits = engine.step_tokens(session, logits.argmax(-1))
        sync(args.device)
        start = time.perf_counter()
        for _ in range(timed):
            logits = engine.step_tokens(session, logits.argmax(-1))
        sync(args.device)
        ms = (time.perf_counter() - start) * 1e3 / timed
        if step == "graph":
            session.graphs = False
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
        with run_profile(activities=activities) as prof:
            for _ in range(timed):
                logits = engine.step_tokens(session, logits.argmax(-1))
            sync(args.device)
    averages = prof.key_averages()
    gpu_ms = sum(e.self_device_time_total for e in averages if e.device_type == DeviceType.CUDA) / 1e3 / timed
    emit({"part": "profile", "model": name, "batch": batch, "config": config, "step": step, "seconds": ms / 1e3,
          "tokens_per_s": batch * 1e3 / ms, "gpu_kernel_ms_per_step": gpu_ms, "peak_gib": peak(args.device)})
    text = [f"# {name}, {config}, step {step}, batch {batch}: {ms:.2f} ms per step over {timed} steps; "
            f"profiled {timed} steps" + (" eagerly" if step == "graph" else "")
            + (f", GPU kernel time {gpu_ms:.2f} ms per step" if args.device.startswith("cuda") else "")]
    if args.device.startswith("cuda"):
        text += ["## by GPU time (self)", averages.table(sort_by="self_device_time_total", row_limit=25)]
    text += ["## by CPU time", averages.table(sort_by="cpu_time_total", row_limit=15)]
    (out / f"profile_{name}_{slug(config)}_b{batch}.txt").write_text("\n".join(text) + "\n")
    print("\n".join(text), flush=True)


def peak(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def alloc_retries(device: str) -> int:
    """How often the caching allocator has found no free block so far: it then frees its cached blocks, synchronizes
    and asks CUDA again, which stalls the step that allocates."""
    return torch.cuda.memory_stats().get("num_alloc_retries", 0) if device.startswith("cuda") else 0


def release(device: str) -> None:
    """Free the last run's sessions and decoders (they hold reference cycles) before the next allocates."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--models", default=None, help=f"comma-separated (default {','.join(FULL_SIZE)}; --tiny: {','.join(TINY)})")
    parser.add_argument("--tiny", action="store_true", help="the bundled tiny fixtures (CPU smoke run)")
    parser.add_argument("--quick", action="store_true", help="a small version of every part")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps", default="auto", help="comma-separated decode steps of the engine: auto (triton on "
                                                        "cuda, reference on cpu), reference, triton, static, graph")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--first-tokens", type=int, default=16,
                        help="decode: the short run whose time is subtracted (0: none, the timed call is the Engine's first)")
    parser.add_argument("--profile-decode", action="store_true",
                        help="decode: the timed call under torch.profiler (OUT/decode_*.txt, gpu_kernel_s)")
    parser.add_argument("--prefill-rows", type=int, default=256)
    parser.add_argument("--prefill-len", type=int, default=4096)
    parser.add_argument("--prefill-segment", type=int, default=2048)
    parser.add_argument("--prefill-tokens", type=int, default=4096)
    parser.add_argument("--gpqa-prompts", type=int, default=GPQA_PROMPTS)
    parser.add_argument("--gpqa-batch", type=int, default=64)
    parser.add_argument("--batching", default="continuous,static", help="gpqa: comma-separated, continuous and/or static")
    parser.add_argument("--scale", type=float, default=1.0, help="divide the GPQA generation lengths by this")
    parser.add_argument("--profile-steps", type=int, default=16)
    parser.add_argument("--no-hf", action="store_true", help="skip HF generate")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.prompt_len, args.new_tokens, args.first_tokens = "4", 16, 8, min(args.first_tokens, 2)
        args.prefill_rows, args.prefill_len, args.prefill_segment, args.prefill_tokens = 4, 32, 16, 32
        args.gpqa_prompts, args.gpqa_batch, args.scale, args.profile_steps = 6, 3, max(args.scale, 1024.0), 2
    args.configs = split_configs(args.configs)
    args.batches = [int(b) for b in str(args.batches).split(",")]
    models = args.models.split(",") if args.models else list(TINY if args.tiny else FULL_SIZE)
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"unknown parts {', '.join(unknown)}; known: {', '.join(PARTS)}")
    unknown = sorted(set(args.batching.split(",")) - {"continuous", "static"})
    if unknown:
        raise SystemExit(f"unknown batching {', '.join(unknown)}; known: continuous, static")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    auto = "triton" if args.device.startswith("cuda") else "reference"
    args.steps = [auto if s == "auto" else s for s in args.steps.split(",")]
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / "generation.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")

    for name in models:
        rm = build(name, args.device)
        if "prefill" in parts:
            prefill_rows(rm, name, args, emit)
        if "decode" in parts:
            decode_rows(rm, name, args, out, emit)
        if "gpqa" in parts:
            gpqa_rows(rm, name, args, emit)
        if "profile" in parts:
            profile(rm, name, args, out, emit)
        if "decode" in parts and not args.no_hf:
            hf_rows(rm, name, args, emit)
        del rm
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(table(rows))


def table(rows: list[dict]) -> str:
    lines = ["| part | model | batch | config | step | batching | seconds | tokens/s | ms/step | first s | est. full s "
             "| peak GiB |",
             "|---|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|"]
    fmt = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['part']} | {r['model']} | {r['batch']} | {r['config']} | {r.get('step', '')} | "
                         f"{r.get('batching', '')} | {r['error']} | | | | | |")
            continue
        step_ms = 1e3 * r["seconds"] if r["part"] == "profile" else r.get("step_ms")  # profile: one step's seconds
        lines.append(f"| {r['part']} | {r['model']} | {r['batch']} | {r['config']} | {r.get('step', '')} | "
                     f"{r.get('batching', '')} | {r['seconds']:.2f} | {r['tokens_per_s']:.0f} | {fmt(step_ms, '.2f')} | "
                     f"{fmt(r.get('first_seconds'), '.2f')} | {fmt(r.get('estimated_full_s'), '.0f')} | "
                     f"{fmt(r.get('peak_gib'), '.1f')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""Full-size architectures with random weights through the ReplaySSM adapters: load, run, time.

    python benchmarks/full_size.py --out OUT.json                       # on a GPU: both 4B architectures
    python benchmarks/full_size.py --models tiny-nemotron-h --tokens 256 --device cpu   # smoke run
    python benchmarks/full_size.py --tokens 32768 --small-segments 256 --out OUT.json   # + the cache-hook paths
    python benchmarks/full_size.py --tokens 8192 --profile-tokens 4096    # + each config's profile (where its time goes)
    python benchmarks/full_size.py --configs fp32,nvfp4/fp16sr --reference-scans kernels,hf   # fp32 both ways

Builds Nemotron-3-Nano-4B and Qwen3.5-4B from `presets.full_size_config` (no download, random
weights, bf16), routes their SSM layers through our kernels and feeds a prompt plus teacher-forced
segments, as the KL driver does, twice per config (after an untimed warm-up run over two segments).
Prints one row per (model, config): generated tokens per second of the second pass (the first pass's too: it
also grows the allocator to the run's length), peak GPU memory, and a plain HF forward over the same tokens
first, as the yardstick (timed after an untimed forward of its own); with --small-segments, the first config also fed
16 tokens per call (the cache-hook path) and one token per call, over that many tokens. Presets that expand to the
same config (`vllm:fp16sr` and `sglang:fp16sr`) run once; the later ones' rows copy it (`measured_as`). The FP32
reference `fp32` runs its segments through our FP32 kernels, as the KL driver's default on the GPU does
(`ReplaySession`'s `reference_scan`), or through HF's scan, or both (`--reference-scans`: one row each).
Random weights say nothing about accuracy; this is the scale and speed check.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM

from replayssm_eval.generate import split_configs
from replayssm_eval.models import ReplayModel, load_model
from replayssm_eval.models.presets import full_size_config
from replayssm_eval.replay.config import ReplayConfig

FULL_SIZE = ("nemotron-3-nano-4b", "qwen3.5-4b")
CONFIGS = ("fp32", "nvfp4:scale=head/fp16sr@16", "nvfp4/fp16sr@16")


def build(name: str, device: str, dtype: torch.dtype) -> ReplayModel:
    if name not in FULL_SIZE:
        return load_model(name, dtype=dtype, device=device)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(full_size_config(name), dtype=dtype)
    return ReplayModel(model)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def feed(rm: ReplayModel, ids: torch.Tensor, prompt_len: int, segment: int, config: str, backend: str,
         device: str, scan: str | None = None) -> tuple[float, torch.Tensor]:
    """Prompt (untimed), then the rest of `ids` in segments of `segment` tokens; returns (seconds, last logits).
    scan: the FP32 reference's `reference_scan` (None: the default, kernels)."""
    session = rm.new_session(config, seq_ids=[0], backend=backend, reference_scan=scan or "kernels")
    rm.forward(ids[:, :prompt_len], session, logits_to_keep=1)
    sync(device)
    start = time.perf_counter()
    for begin in range(prompt_len, ids.shape[1], segment):
        logits = rm.forward(ids[:, begin:begin + segment], session, logits_to_keep=1)
    sync(device)
    return time.perf_counter() - start, logits


def run_config(rm: ReplayModel, ids: torch.Tensor, prompt_len: int, segment: int, config: str, backend: str,
               device: str, scan: str | None = None) -> dict:
    """Teacher-forced segments after a warm-up run over two segments (Triton compiles are not timed), twice: the
    first pass grows the caching allocator to the run's length (what the first document of a process pays), the second
    is what every later document pays and what the plain forward is timed as (after an untimed pass of its own).
    Returns both passes' generated tokens/s, the last logits' finiteness and, for an FP32 reference through the
    kernels, the largest difference from HF's scan that its layers' checks found (once a layer, in the warm-up)."""
    feed(rm, ids[:, :prompt_len + 2 * segment], prompt_len, segment, config, backend, device, scan)
    first, _ = feed(rm, ids, prompt_len, segment, config, backend, device, scan)
    seconds, logits = feed(rm, ids, prompt_len, segment, config, backend, device, scan)
    generated = ids.shape[1] - prompt_len
    row = {"config": config, "segment": segment, "tokens_per_s": generated / seconds, "seconds": seconds,
           "first_pass_tokens_per_s": generated / first, "finite": bool(torch.isfinite(logits).all())}
    if scan == "kernels" and rm.reference_checks:
        row["reference_check_max"] = {key: max(c[key] for c in rm.reference_checks.values())
                                      for key in ("output", "state")}
    return row


def profile_config(rm: ReplayModel, ids: torch.Tensor, prompt_len: int, segment: int, config: str, backend: str,
                   device: str, scan: str | None) -> None:
    """Print where a config's teacher-forced segments spend their time: torch.profiler's top operators and kernels by
    self GPU time and by self CPU time (the run is compiled and warm: `run_config` ran first)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        seconds, _ = feed(rm, ids, prompt_len, segment, config, backend, device, scan)
    print(f"profile of {config}: {ids.shape[1] - prompt_len} tokens in {seconds:.3f} s (profiled)")
    events = prof.key_averages()
    for key in (("self_cuda_time_total",) if device.startswith("cuda") else ()) + ("self_cpu_time_total",):
        print(events.table(sort_by=key, row_limit=18, max_name_column_width=70), flush=True)


def runs(configs: list[str], scans: list[str]) -> list[tuple[str, str | None]]:
    """(config, reference scan) pairs to time: the FP32 reference once per scan, every other config once (None)."""
    pairs = []
    for config in configs:
        parsed = ReplayConfig.parse(config)
        pairs += [(config, scan) for scan in (scans if parsed.is_reference and parsed.window == 1 else [None])]
    return pairs


def plain_forward(rm: ReplayModel, ids: torch.Tensor, device: str) -> float:
    """Seconds of one unrouted HF forward over all tokens (no cache), the yardstick, after an untimed one (the first
    run's allocations and compiles are not timed); leaves rm unrouted."""
    rm.remove()
    with torch.no_grad():
        rm.model(input_ids=ids, logits_to_keep=1)  # warm up
        sync(device)
        start = time.perf_counter()
        rm.model(input_ids=ids, logits_to_keep=1)
        sync(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(FULL_SIZE))
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--tokens", type=int, default=8192, help="generated tokens per config")
    parser.add_argument("--small-segments", type=int, default=0,
                        help="also time this many tokens fed in segments of 16 and one by one (first config)")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain HF forward")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--segment", type=int, default=2048)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--reference-scans", default="kernels",
                        help="what runs the fp32 reference's segments, one row each: kernels, hf or kernels,hf")
    parser.add_argument("--profile-tokens", type=int, default=0,
                        help="also profile each config over this many teacher-forced tokens (0: no profile)")
    parser.add_argument("--out")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    rows = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    for name in args.models.split(","):
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        rm = build(name, args.device, dtype)
        load_s = time.perf_counter() - start
        params = sum(p.numel() for p in rm.model.parameters())
        print(f"{name}: {params / 1e6:.1f} M parameters, {len(rm.layers)} SSM layers, built in {load_s:.1f} s", flush=True)
        vocab = rm.model.config.get_text_config().vocab_size
        ids = torch.randint(0, vocab, (1, args.prompt_len + args.tokens), generator=torch.Generator().manual_seed(0))
        ids = ids.to(args.device)
        if not args.no_plain:
            row = {"model": name, "config": "plain HF forward", "tokens": ids.shape[1]}
            try:
                plain = plain_forward(rm, ids, args.device)
                row.update(tokens_per_s=ids.shape[1] / plain, seconds=plain)
            except torch.OutOfMemoryError as err:  # HF's Mamba-2 torch scan over 128K tokens in one call needs TiBs
                row["error"] = f"OutOfMemoryError: {str(err).splitlines()[0]}"
            emit(row)
            rm = ReplayModel(rm.model, rm.tokenizer)  # routed again
        measured = {}  # (expansion, scan) -> its row: presets that expand to one config (vllm:fp16sr, sglang:fp16sr)
        # run once
        for config, scan in runs(split_configs(args.configs), args.reference_scans.split(",")):
            expansion = str(ReplayConfig.parse(config))
            if (expansion, scan) in measured:
                first = measured[expansion, scan]
                emit({**first, "config": config, "measured_as": first["config"]})
                continue
            try:
                row = run_config(rm, ids, args.prompt_len, args.segment, config, args.backend, args.device, scan)
            except Exception as err:  # one failing row must not lose the others
                row = {"config": config, "error": f"{type(err).__name__}: {err}"}
            row.update(model=name, tokens=args.tokens, backend=args.backend, expansion=expansion)
            if scan is not None:
                row["reference_scan"] = scan
            if args.device.startswith("cuda"):
                row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            measured[expansion, scan] = row
            emit(row)
            if args.profile_tokens and "error" not in row:
                profile_config(rm, ids[:, :args.prompt_len + args.profile_tokens], args.prompt_len, args.segment,
                               config, args.backend, args.device, scan)
        config = split_configs(args.configs)[0]
        for segment in (16, 1) if args.small_segments else ():
            short = ids[:, :args.prompt_len + args.small_segments]
            row = run_config(rm, short, args.prompt_len, segment, config, args.backend, args.device)
            row.update(model=name, tokens=args.small_segments, backend=args.backend,
                       path="segments of 16 (cache-hook path)" if segment == 16 else "token by token")
            emit(row)
        del rm
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()

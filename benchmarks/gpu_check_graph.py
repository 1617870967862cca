"""GPU check and speed of the captured decode step (`engine.Engine(step="graph")`).

    python benchmarks/gpu_check_graph.py --out OUT_DIR                    # checks, then full-size timing
    python benchmarks/gpu_check_graph.py --out OUT_DIR --new-tokens 256   # shorter timing runs
    python benchmarks/gpu_check_graph.py --out OUT_DIR --skip-speed       # the checks only
    python benchmarks/gpu_check_graph.py --out OUT_DIR --skip-checks --models qwen3.5-4b   # one model's timing
    python benchmarks/gpu_check_graph.py --out OUT_DIR --skip-speed --check-models tiny-kimi-linear   # one model's checks
    python benchmarks/gpu_check_graph.py --out OUT_DIR --skip-speed --check-configs 'nvfp4/fp16sr@4#rt=int8@prompt'

Checks (the bundled tiny models, one per SSM family: Mamba-2, GDN, KDA; fp32 weights, prompts of
different lengths, windows of 4 so twelve tokens cross several flushes; two configs round-trip the state
through SGLang's INT8 pool: at the prompt's end, which the fixed-buffer steps take before the state enters
their buffers, and every 5 tokens, which each row takes at its own positions inside the buffers and graphs),
each must hold bit for bit:
- whole model: `StaticDecoder` replaying its CUDA graphs equals the same decoder run eagerly and
  the eager Triton step session on a Hugging Face StaticCache: tokens, last logits and every SSM
  layer's carried state (both stored copies and their error-feedback residuals, packed read copy, ring buffer,
  phases, checkpoints);
- per layer: step="static" (each SSM layer's step a CUDA graph, HF's dynamic cache) equals
  step="triton": tokens, logits, states;
- continuous batching: `Engine(step="graph")` with rows leaving and joining (ENGINE_LIMITS, two
  rows at once: every regroup builds a decoder and captures its graphs) gives the same tokens with
  its graphs replayed as with the same decoders run eagerly.
Also reported, not judged: the graph path's tokens against step="triton" on HF's dynamic cache
and their largest logit difference (SDPA over a static cache's masked columns need not sum in
the dynamic cache's order), and the graph engine's tokens against `Engine(step="triton")`.

Speed (random-weight full-size models from `models.presets`, bf16): decode tokens/s of the
captured whole-model step at each batch, per config, against Hugging Face `generate` (greedy,
`min_new_tokens` = `max_new_tokens`) on the same model and batch. Our decoder prefills
`--prefill` tokens, then opens the KV columns up to `--prompt-len` (`open_prompt_columns`: zeros that
attention reads like written ones), and sizes its static KV cache for `--prompt-len + --new-tokens`:
every step attends over a `--prompt-len` prompt and the tokens so far (HF's prefill scan of a full
prompt runs out of memory on Nemotron at these batches). HF generate gets the full `--prompt-len`
prompt, or `--prefill` tokens where that runs out of memory (noted per row; its dynamic cache is
then shorter, which favours HF). Our first 2L + 1 steps (Triton compiles, the two graph captures)
are not timed; HF's prefill (a `max_new_tokens=1` run) is subtracted from its time.
Writes OUT_DIR/gpu_check_graph.json and prints the tables.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, StaticCache
from transformers.cache_utils import StaticLayer

from replayssm_eval.generate.decode import decode_session, left_pad, sequence_id
from replayssm_eval.formats import PackedState
from replayssm_eval.generate.engine import Engine
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.models import ReplayModel, load_model
from replayssm_eval.models.model_graph import StaticDecoder
from replayssm_eval.models.presets import full_size_config
from replayssm_eval.models.session import ReplaySession

CHECK_MODELS = ("tiny-nemotron-h", "tiny-qwen3.5", "tiny-kimi-linear")
CHECK_CONFIGS = ("fp32", "nvfp4/fp16sr@4", "shared:nvfp4@4", "nvfp4/fp8sr@4", "shared:fp8sr@4",
                 "nvfp4/fp16sr@4#rt=int8:axis=headdim@prompt",  # a prefix-cache hit: round trip before the buffers
                 "nvfp4/fp8sr@4#rt=int8:axis=headdim@every:5",  # pages of 5 tokens: round trips inside the buffers
                 "int8:ef=fp32/fp16sr:ef=bf16@4",  # error feedback: the residuals in the fixed buffers and graphs
                 "stepquant:dualaxis6")  # dual-axis factors: the one-launch encoder at every step
CHECK_PROMPTS = ("ROMEO:\nBut soft, what light through yonder", "KING HENRY:\nOnce", "To be")
CHECK_TOKENS = 12
ENGINE_LIMITS = (12, 1, 20, 6)  # per CHECK_PROMPTS row and one more: rows leave at different steps
SPEED_MODELS = ("qwen3.5-4b", "nemotron-3-nano-4b")
SPEED_CONFIGS = ("fp32", "nvfp4:scale=head/fp16sr")


def same_states(ours: dict, eager: dict) -> bool:
    if ours.keys() != eager.keys():
        return False
    for layer, b in eager.items():
        a = ours[layer]
        tensors = [(a.hi, b.hi), (a.lo, b.lo), (a.checkpoint, b.checkpoint), (a.schedule.count, b.schedule.count)]
        tensors += [(a.buffer[k], b.buffer[k]) for k in b.buffer]
        if a.residual.keys() != b.residual.keys():
            return False
        tensors += [(a.residual[copy], b.residual[copy]) for copy in b.residual]
        for name in PackedState.FIELDS:
            x, y = getattr(a.lo_packed, name), getattr(b.lo_packed, name)
            if (x is None) != (y is None):
                return False
            if x is not None:
                tensors.append((x, y))
        if not all(torch.equal(x, y) for x, y in tensors):
            return False
    return True


def run_decoder(rm, config, ids, mask, seq_ids, steps, max_len, graphs):
    decoder = StaticDecoder(rm, config, ids, mask, seq_ids, max_len=max_len, graphs=graphs)
    logits, tokens = decoder.prefill(), []
    for _ in range(steps):
        tokens.append(logits.argmax(-1))
        logits = decoder.step(tokens[-1])
    return torch.stack(tokens, 1), logits, decoder.session.states


def run_session(rm, session, ids, mask, steps):
    logits = rm.forward(ids, session, attention_mask=mask, logits_to_keep=1)[:, -1]
    tokens = []
    for _ in range(steps):
        tokens.append(logits.argmax(-1))
        logits = rm.forward(tokens[-1][:, None], session, logits_to_keep=1)[:, -1]
    return torch.stack(tokens, 1), logits, session.states


@torch.no_grad()
def check(name: str, config: str) -> dict:
    rm = load_model(name, dtype="fp32", device="cuda", backend="triton")
    prompts = [rm.tokenizer.encode(t) for t in CHECK_PROMPTS]
    ids, mask = left_pad(prompts, rm.tokenizer.pad_token_id or 0, "cuda")
    seq_ids = [sequence_id(p) for p in prompts]
    max_len = ids.shape[1] + CHECK_TOKENS
    text_config = rm.model.config.get_text_config(decoder=True)
    graph = run_decoder(rm, config, ids, mask, seq_ids, CHECK_TOKENS, max_len, graphs=True)
    eager = run_decoder(rm, config, ids, mask, seq_ids, CHECK_TOKENS, max_len, graphs=False)
    on_static = run_session(rm, ReplaySession(config, seq_ids=seq_ids, engine="step", backend="triton", new_cache=lambda: StaticCache(
        config=text_config, max_cache_len=max_len)), ids, mask, CHECK_TOKENS)
    triton = run_session(rm, decode_session(rm, config, seq_ids, "triton"), ids, mask, CHECK_TOKENS)
    layer_graphs = run_session(rm, decode_session(rm, config, seq_ids, "static"), ids, mask, CHECK_TOKENS)

    def same(a, b):
        return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and same_states(a[2], b[2])

    row = {
        "model": name, "config": config,
        "graph_eq_eager_static": same(graph, eager),
        "graph_eq_triton_static_cache": same(graph, on_static),
        "layer_graphs_eq_triton": same(layer_graphs, triton),
        "graph_tokens_eq_triton_dynamic_cache": torch.equal(graph[0], triton[0]),
        "graph_vs_dynamic_max_logit_diff": float((graph[1] - triton[1]).abs().max()),
        "checkpoints": int(max(int(s.checkpoint.max()) for s in graph[2].values())),
    }
    row.update(engine_check(rm, config, prompts + [prompts[0][:5]]))
    row["ok"] = (row["graph_eq_eager_static"] and row["graph_eq_triton_static_cache"] and row["layer_graphs_eq_triton"]
                 and row["engine_graphs_eq_eager"])
    return row


def engine_check(rm, config, prompts) -> dict:
    """Engine(step="graph"), continuous batching of two rows: captured graphs against the same decoders run eagerly."""
    def tokens(step, graphs):
        engine = Engine(rm, config, step=step, max_batch=2, prefill_segment=8, refill=1, stop_at_eos=False)
        engine.graphs = graphs and step == "graph"
        return [g.tokens for g in engine.generate(prompts, max_gen_toks=list(ENGINE_LIMITS))]

    graph = tokens("graph", True)
    return {"engine_graphs_eq_eager": graph == tokens("graph", False),
            "engine_graph_tokens_eq_triton": graph == tokens("triton", False)}


def build(name: str) -> ReplayModel:
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(full_size_config(name), dtype=torch.bfloat16)
    return ReplayModel(model.eval())


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


@torch.no_grad()
def ours(rm, config, batch, args) -> dict:
    window = ReplayConfig.parse(config).window
    warm = 2 * window + 1
    if args.new_tokens <= warm:
        raise ValueError(f"--new-tokens must exceed the {warm} warm-up steps of config {config!r}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, rm.model.config.vocab_size, (batch, args.prefill), device="cuda", generator=gen)
    torch.cuda.reset_peak_memory_stats()
    decoder = StaticDecoder(rm, config, ids, None, list(range(batch)), max_len=args.prompt_len + args.new_tokens + 1,
                            graphs=True)
    token = decoder.prefill().argmax(-1)
    open_prompt_columns(decoder, args.prompt_len)

    def steps(n):
        nonlocal token
        for _ in range(n):
            token = decoder.step(token).argmax(-1)

    steps(warm)
    seconds = timed(lambda: steps(args.new_tokens - warm))
    out = {"tokens_per_s": batch * (args.new_tokens - warm) / seconds, "step_ms": 1e3 * seconds / (args.new_tokens - warm),
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    del decoder
    gc.collect()  # the decoder's session and cache point at each other
    torch.cuda.empty_cache()
    return out


def open_prompt_columns(decoder: StaticDecoder, prompt_len: int) -> None:
    """Make the decoder's KV caches hold a `prompt_len`-token prompt after its shorter prefill: the columns past the
    prefill's (zeros) opened in its mask and counted in every attention cache's length, the positions moved on. Each
    step's attention then reads and weighs them like written columns (its time does not depend on their values),
    and the SSM layers carry the prefill's states."""
    for layer in decoder.session.cache.layers:
        if isinstance(layer, StaticLayer):
            layer.cumulative_length.fill_(prompt_len)
    decoder.attend[:, 0, 0, decoder.written:prompt_len] = True
    decoder.position += prompt_len - decoder.written
    decoder.column.fill_(prompt_len)
    decoder.written = prompt_len


@torch.no_grad()
def hf_generate(model, batch, args) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for prompt in (args.prompt_len, args.prefill):
        ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda", generator=gen)
        run = lambda n: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,  # noqa: E731
                                       min_new_tokens=n, do_sample=False, pad_token_id=0)
        try:
            first = timed(lambda: run(1))
            total = timed(lambda: run(args.new_tokens))
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            continue
        torch.cuda.empty_cache()
        return {"tokens_per_s": batch * (args.new_tokens - 1) / (total - first), "prompt": prompt}
    return {"tokens_per_s": None, "prompt": "out of memory"}


def speed(args) -> list[dict]:
    rows = []
    for name in args.models:
        rm = build(name)
        for batch in args.batches:
            row = {"model": name, "batch": batch}
            for config in SPEED_CONFIGS:
                try:
                    row[config] = ours(rm, config, batch, args)
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    row[config] = {"tokens_per_s": None, "error": "out of memory"}
            rows.append(row)
            print(json.dumps(row), flush=True)
        rm.remove()
        for row in rows if not args.no_hf else ():
            if row["model"] == name:
                row["hf_generate"] = hf_generate(rm.model, row["batch"], args)
                print(json.dumps(row), flush=True)
        del rm
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="folder for gpu_check_graph.json")
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--prefill", type=int, default=64, help="prompt tokens actually fed (see the docstring)")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--models", nargs="+", default=list(SPEED_MODELS), choices=SPEED_MODELS)
    parser.add_argument("--check-models", nargs="+", default=list(CHECK_MODELS), choices=CHECK_MODELS)
    parser.add_argument("--check-configs", nargs="+", default=list(CHECK_CONFIGS), help="configs of the checks")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--no-hf", action="store_true", help="skip HF generate in the speed rows")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check_graph needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"checks": [], "speed": []}
    start = time.perf_counter()
    for name in () if args.skip_checks else args.check_models:
        for config in args.check_configs:
            row = check(name, config)
            result["checks"].append(row)
            print(json.dumps(row), flush=True)
    (args.out / "gpu_check_graph.json").write_text(json.dumps(result, indent=1))
    if not args.skip_speed:
        result["speed"] = speed(args)
    result["seconds"] = time.perf_counter() - start
    (args.out / "gpu_check_graph.json").write_text(json.dumps(result, indent=1))

    print(f"\n{'model':18} {'config':42} {'graph=eager':>11} {'=triton(static)':>15} {'layer graphs':>12} "
          f"{'tokens=dynamic':>14} {'logit diff':>10} {'engine=eager':>12} {'engine=triton':>13}")
    for r in result["checks"]:
        print(f"{r['model']:18} {r['config']:42} {r['graph_eq_eager_static']!s:>11} {r['graph_eq_triton_static_cache']!s:>15} "
              f"{r['layer_graphs_eq_triton']!s:>12} {r['graph_tokens_eq_triton_dynamic_cache']!s:>14} "
              f"{r['graph_vs_dynamic_max_logit_diff']:>10.2e} {r['engine_graphs_eq_eager']!s:>12} "
              f"{r['engine_graph_tokens_eq_triton']!s:>13}")
    if result["speed"]:
        print(f"\ntokens/s, prompt {args.prompt_len} + {args.new_tokens} new tokens")
        print(f"{'model':20} {'batch':>5} " + " ".join(f"{c:>24}" for c in SPEED_CONFIGS) + f" {'HF generate':>12} {'x HF':>6}")
        for r in result["speed"]:
            tps = [r[c]["tokens_per_s"] for c in SPEED_CONFIGS]
            hf = r.get("hf_generate", {}).get("tokens_per_s")
            ratio = f"{tps[-1] / hf:6.1f}" if hf and tps[-1] else "     -"
            cells = " ".join(f"{t:>24.0f}" if t else f"{'OOM':>24}" for t in tps)
            print(f"{r['model']:20} {r['batch']:>5} {cells} {hf or 0:>12.0f} {ratio}")
    failed = [r for r in result["checks"] if not r["ok"]]
    print(f"\n{len(result['checks']) - len(failed)}/{len(result['checks'])} checks passed, {result['seconds']:.0f} s")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

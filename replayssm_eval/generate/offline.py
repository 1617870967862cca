"""Generate where lm-eval is not installed (a GPU machine), score here: the accuracy run in three steps.

    replayssm-eval accuracy --data fixtures --max-gen-toks 1024 --export-requests requests.jsonl   # 1. here
    python -m replayssm_eval.generate.offline requests.jsonl gens.jsonl --model tiny-qwen3.5 \
        --configs fp32,shared:nvfp4,nvfp4/fp16sr,nvfp4/fp8sr                                    # 2. on the GPU
    replayssm-eval accuracy --model tiny-qwen3.5 --data fixtures --max-gen-toks 1024 --generations gens.jsonl  # 3. here

Step 1 runs lm-eval's request building (prompts, stop strings, max_gen_toks, sampling settings from
`--gen-kwargs`) with `RequestRecorder` (`accuracy.recorded`) and writes one line per request, with the run's
`--samples` n and `--sampling-seed`; step 2 (this module: no lm-eval, datasets or math-verify
needed) decodes samples 0..n-1 of every request under every config with `engine.Engine` (continuous
batching, the Triton decode step on cuda), one line each with its `sample` index, sampling settings
and seed; step 3 is a normal accuracy run (the same --gen-kwargs, --samples, --sampling-seed) whose
model (`accuracy.recorded.RecordedLM`) answers from the file and refuses answers drawn with other settings, so
scoring, buckets, outputs and resumption are the same. The sampling settings travel in the requests
file: step 2 takes no sampling option.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from replayssm_eval.generate import DECODE_STEPS
from replayssm_eval.generate.engine import PREFILL_SEGMENT, PREFILL_TOKENS


def generate_requests(requests_path, out_path, *, model: str, configs: list[str], batch_size: int | str,
                      device: str = "auto", prefill_segment: int = PREFILL_SEGMENT, prefill_tokens: int = PREFILL_TOKENS,
                      step: str = "auto") -> Path:
    """Step 2: every request of `requests_path` under every config; appends to `out_path`, skipping configs already in it.

    Every config decodes all requests with continuous batching (`engine.Engine`, at most
    `batch_size` rows at once, or `auto`: `memory`); the first config (FP32) in request order, the
    others longest FP32 generation first, so the rows of a batch stop at about the same time. A request
    with `samples` n is n rows (samples 0..n-1) drawn with its `sampling` settings under its `sampling_seed`.
    step: the engine's decode step (auto: triton on cuda, reference on cpu).
    """
    import torch

    from replayssm_eval.generate.degeneration import is_loop
    from replayssm_eval.generate.engine import Engine
    from replayssm_eval.generate.memory import plan_rows
    from replayssm_eval.generate.sampling import Sampling
    from replayssm_eval.models import load_model

    requests = _read_jsonl(requests_path)
    seeds = {r.get("sampling_seed", 0) for r in requests}
    if len(seeds) != 1:
        raise ValueError(f"{requests_path} mixes sampling seeds {sorted(seeds)}; export one run's requests per file")
    seed = seeds.pop()
    rows = [(i, j) for i, r in enumerate(requests) for j in range(r.get("samples", 1))]  # (request, sample)
    settings = [Sampling(**requests[i].get("sampling", {})) for i, _ in rows]
    out_path = Path(out_path)
    written = _read_jsonl(out_path) if out_path.exists() else []
    done = {line["config"] for line in written}
    device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    if step == "auto":
        step = "triton" if cuda else "reference"
    rm = load_model(model, dtype="bfloat16" if cuda else "float32", device=device, backend="triton" if cuda else "torch")
    prompts = [rm.tokenizer.encode(requests[i]["prompt"]) for i, _ in rows]
    limits = [requests[i]["max_gen_toks"] for i, _ in rows]
    for config in configs:
        if config in done:
            continue
        fp32 = {(a["task"], a["doc_id"], a.get("sample", 0)): a["gen_tokens"] for a in written if a["config"] == configs[0]}
        order = None
        if config != configs[0] and fp32:
            order = sorted(range(len(rows)), key=lambda k: -fp32.get((requests[rows[k][0]]["task"],
                                                                      requests[rows[k][0]]["doc_id"], rows[k][1]), 0))
        fit = plan_rows(rm, config, batch_size, max(len(p) + m for p, m in zip(prompts, limits)), step=step,
                        prefill_segment=prefill_segment, prefill_tokens=prefill_tokens, default=32)
        start = time.perf_counter()
        engine = Engine(rm, config, step=step, max_batch=min(fit, len(prompts)), prefill_segment=prefill_segment,
                        prefill_tokens=prefill_tokens, sampling_seed=seed)
        gens = engine.generate(prompts, max_gen_toks=limits, until=[requests[i]["until"] for i, _ in rows], order=order,
                               sampling=settings, samples=[j for _, j in rows])
        lines = [{"config": config, "task": requests[i]["task"], "doc_id": requests[i]["doc_id"], "sample": j,
                  "sampling": h.as_dict(), "sampling_seed": seed, "text": g.text, "gen_tokens": g.gen_tokens,
                  "hit_max_gen_toks": g.hit_max_gen_toks, "max_gen_toks": g.max_gen_toks, "loop": is_loop(g.tokens)}
                 for (i, j), h, g in zip(rows, settings, gens)]
        with open(out_path, "a", encoding="utf-8") as f:  # a config is appended whole: the unit of resumption
            f.writelines(json.dumps(line) + "\n" for line in lines)
        written += lines
        print(f"{config}: {len(lines)} generations, mean {sum(x['gen_tokens'] for x in lines) / len(lines):.0f} tokens, "
              f"batch {engine.max_batch}, {time.perf_counter() - start:.0f} s", flush=True)
    return out_path


def _read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="step 2 of an offline accuracy run: generate the exported requests")
    parser.add_argument("requests")
    parser.add_argument("generations")
    parser.add_argument("--model", required=True)
    parser.add_argument("--configs", required=True, help="comma-separated ReplayConfigs (fp32 first)")
    parser.add_argument("--max-batch-size", default="32", help="most rows decoded at once, or auto (fits the GPU)")
    parser.add_argument("--prefill-segment", type=int, default=PREFILL_SEGMENT)
    parser.add_argument("--prefill-tokens", type=int, default=PREFILL_TOKENS)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--step", default="auto", choices=("auto", *DECODE_STEPS),
                        help="decode step (auto: triton on cuda, reference on cpu; graph: the whole model's step as a "
                             "CUDA graph, fixed-window configs)")
    args = parser.parse_args(argv)
    from replayssm_eval.generate import split_configs
    from replayssm_eval.replay.config import ReplayConfig

    configs = [ReplayConfig.parse(c).name for c in split_configs(args.configs)]
    generate_requests(args.requests, args.generations, model=args.model, configs=configs,
                      batch_size=args.max_batch_size if args.max_batch_size == "auto" else int(args.max_batch_size),
                      device=args.device, prefill_segment=args.prefill_segment, prefill_tokens=args.prefill_tokens,
                      step=args.step)


if __name__ == "__main__":
    main()

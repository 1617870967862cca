"""Generate where lm-eval is not installed (a GPU machine), score here: the accuracy run in three steps.

    replayssm-eval accuracy --data fixtures --max-gen-toks 1024 --export-requests requests.jsonl   # 1. here
    python -m replayssm_eval.tasks.offline requests.jsonl gens.jsonl --model tiny-qwen3.5 \
        --configs fp32,shared:nvfp4,nvfp4/fp16sr,nvfp4/fp8sr                                    # 2. on the GPU
    replayssm-eval accuracy --model tiny-qwen3.5 --data fixtures --max-gen-toks 1024 --generations gens.jsonl  # 3. here

Step 1 runs lm-eval's request building (prompts, stop strings, max_gen_toks) with `RequestRecorder`
(`recorded`) and writes one line per request; step 2 (this module: no lm-eval, datasets or
math-verify needed) decodes every request under every config with `generation.greedy_generate`
(the Triton decode step on cuda) in batches of similar length; step 3 is a normal accuracy run
whose model (`recorded.RecordedLM`) answers from the file, so scoring, buckets, outputs and
resumption are the same.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def generate_requests(requests_path, out_path, *, model: str, configs: list[str], batch_size: int,
                      device: str = "auto") -> Path:
    """Step 2: every request of `requests_path` under every config; appends to `out_path`, skipping configs already in it."""
    import torch

    from replayssm_eval.models import load_model
    from replayssm_eval.tasks.generation import greedy_generate

    requests = _read_jsonl(requests_path)
    out_path = Path(out_path)
    done = {line["config"] for line in _read_jsonl(out_path)} if out_path.exists() else set()
    device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    rm = load_model(model, dtype="bfloat16" if cuda else "float32", device=device, backend="triton" if cuda else "torch")
    rows = sorted(((r, rm.tokenizer.encode(r["prompt"])) for r in requests),
                  key=lambda x: (x[0]["max_gen_toks"], -len(x[1])))
    for config in configs:
        if config in done:
            continue
        lines = []
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            for limit in sorted({r["max_gen_toks"] for r, _ in batch}):  # one max_gen_toks per call
                part = [(r, p) for r, p in batch if r["max_gen_toks"] == limit]
                gens = greedy_generate(rm, [p for _, p in part], config=config, max_gen_toks=limit,
                                       until=[r["until"] for r, _ in part], step="triton" if cuda else "reference")
                lines += [json.dumps({"config": config, "task": r["task"], "doc_id": r["doc_id"], "text": g.text,
                                      "gen_tokens": g.gen_tokens, "hit_max_gen_toks": g.hit_max_gen_toks,
                                      "max_gen_toks": g.max_gen_toks}) + "\n" for (r, _), g in zip(part, gens)]
        with open(out_path, "a", encoding="utf-8") as f:  # a config is appended whole: the unit of resumption
            f.writelines(lines)
        print(f"{config}: {len(lines)} generations, mean {sum(json.loads(x)['gen_tokens'] for x in lines) / len(lines):.0f} tokens",
              flush=True)
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
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    from replayssm_eval.kernels.config import ReplayConfig
    from replayssm_eval.tasks import split_configs

    configs = [ReplayConfig.parse(c).name for c in split_configs(args.configs)]
    generate_requests(args.requests, args.generations, model=args.model, configs=configs, batch_size=args.batch_size,
                      device=args.device)


if __name__ == "__main__":
    main()

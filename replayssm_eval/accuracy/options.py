"""The options of an accuracy run (`AccuracyConfig`): what `replayssm-eval accuracy` offers and
`accuracy.driver.run_accuracy` takes."""

from __future__ import annotations

from dataclasses import dataclass

from replayssm_eval.accuracy import DEFAULT_TASKS, TASKS
from replayssm_eval.generate import DECODE_STEPS
from replayssm_eval.generate.sampling import GEN_KWARGS
from replayssm_eval.options import option
from replayssm_eval.results.buckets import DEFAULT_BUCKETS

DEFAULT_CONFIGS = "fp32,shared:nvfp4,nvfp4/fp16sr,nvfp4/fp8sr"
DATA_SOURCES = "hub, fixtures, or a directory holding <task>/<the hub's files> (synthetic tasks: <task>/test.jsonl)"


@dataclass(frozen=True)
class AccuracyConfig:
    """Options of `replayssm-eval accuracy` (one field per option)."""

    model: str = option("tiny-nemotron-h", "bundled fixture name, local directory or hub id")
    tasks: str = option(",".join(DEFAULT_TASKS), f"comma-separated tasks; known: {', '.join(TASKS)}")
    configs: str = option(DEFAULT_CONFIGS, "comma-separated ReplayConfigs; fp32 runs first (added if missing)")
    limit: int | None = option(None, "first N questions of each task (default: all)")
    buckets: str = option(DEFAULT_BUCKETS, "FP32 length buckets: quantile:K or fixed starts such as 1,512,2048")
    data: str = option("hub", f"where the questions come from: {DATA_SOURCES}")
    max_gen_toks: int | None = option(None, "generation limit for every task and config (default: each task's YAML)")
    chat_template: bool = option(False, "wrap prompts in the tokenizer's chat template (instruction-tuned models)")
    gen_kwargs: str | None = option(None, f"sampling settings, e.g. temperature=0.6,top_p=0.95,top_k=20 (keys: "
                                          f"{', '.join(GEN_KWARGS)}; default: greedy)")
    samples: int = option(1, "samples per question (avg@n); above 1 needs sampling (--gen-kwargs temperature > 0)")
    sampling_seed: int = option(0, "seed of the sampled tokens' random numbers, the same under every config")
    max_batch_size: str = option("16", "most questions decoded at once (continuous batching), or auto: the largest "
                                       "batch that fits the GPU; a batch that does not fit is refused before any work")
    prefill_segment: int = option(2048, "prompt tokens per row and prefill call (bounds the prefill workspace)")
    prefill_tokens: int = option(4096, "prompt tokens per prefill call (rows x segment)")
    step: str = option("auto", "decode step: auto (triton on cuda, reference on cpu), or graph: the whole model's step "
                               "as a CUDA graph (fixed-window configs; Mamba-2, GDN and KDA models)", ("auto", *DECODE_STEPS))
    device_map: str | None = option(None, "e.g. auto: spread a large model over the GPUs (accelerate)")
    device: str = option("auto", "auto: cuda if available", ("auto", "cuda", "cpu"))
    dtype: str = option("auto", "weights and activations (auto: bfloat16 on cuda, float32 on cpu)",
                         ("auto", "float32", "bfloat16", "float16"))
    bootstrap_iters: int = option(10000, "paired bootstrap resamples per bucket")
    export_requests: str | None = option(None, "only write the generation requests to this .jsonl, for "
                                                "`python -m replayssm_eval.generate.offline` on a machine without lm-eval")
    generations: str | None = option(None, "answer from this generations .jsonl (written by replayssm_eval.generate.offline) "
                                            "instead of loading the model")
    output: str | None = option(None, "output directory (default reports/accuracy-<model>-<UTC time>/); "
                                       "an existing run there is continued")

"""The options of a KL run (`KLConfig`): what `replayssm-eval kl` offers and `kl.driver.run_kl` takes."""

from __future__ import annotations

from dataclasses import dataclass

from replayssm_eval.data.sources import DATASETS, PACK_MODES
from replayssm_eval.options import option

DEFAULT_CONFIGS = ("shared:nvfp4", "nvfp4/fp32", "nvfp4/fp16sr")
MAX_TOKENS = 131072


@dataclass(frozen=True)
class KLConfig:
    """Options of `replayssm-eval kl` (one field per option)."""

    model: str = option("tiny-nemotron-h", "bundled fixture name, local directory or hub id")
    config: tuple[str, ...] = option(
        (), "ReplayConfig compared with fp32, e.g. nvfp4/fp16sr or shared:nvfp4@8#seed=1; "
        f"with neither this nor --read/--recur/--window: {', '.join(DEFAULT_CONFIGS)}"
    )
    read: str | None = option(None, "short form of one split config: read-copy format (default fp32)")
    recur: str | None = option(None, "short form: recurrence-copy format (default fp32)")
    window: int | None = option(None, "short form: window L (default 16)")
    seed: int | None = option(None, "short form: stochastic-rounding seed (default 0)")
    dataset: str | None = option(None, "hub dataset, streamed (default: --data-files, else the bundled text)",
                                 tuple(DATASETS))
    data_files: tuple[str, ...] = option((), "local .txt/.jsonl/.parquet in the PG-19 schema (globs allowed)")
    pack: str = option(
        "concat", "concat: join documents with eos and cut; filter: one piece per long-enough document", PACK_MODES
    )
    min_doc_tokens: int = option(0, "skip source documents shorter than this")
    num_docs: int = option(3, "documents evaluated")
    prompt_len: int = option(256, "prefill tokens; its end anchors the window phase")
    tokens: int = option(2048, f"generated (teacher-forced) tokens per document, at most {MAX_TOKENS}")
    segment_len: int = option(2048, "tokens per lockstep segment (rounded up to a multiple of every window)")
    buckets: str = option("pow2", "length buckets: pow2, log:N, or starts such as 1,64,1024")
    batch_size: int = option(1, "documents run in parallel; results differ at about 1e-6 relative between batch "
                                "sizes (FP32 summation order), so compare runs made with the same batch size")
    device: str = option("auto", "auto: cuda if available", ("auto", "cuda", "cpu"))
    dtype: str = option(
        "auto", "weights and activations (auto: bfloat16 on cuda, float32 on cpu)",
        ("auto", "float32", "bfloat16", "float16"),
    )
    device_map: str | None = option(None, "e.g. auto: spread a large model over the GPUs (accelerate)")
    backend: str = option("auto", "SSM kernels (auto: triton on cuda, torch on cpu)", ("auto", "torch", "triton"))
    reference_scan: str = option(
        "auto", "what runs the FP32 reference's segments: hf (Hugging Face's own FP32 chunk scan), kernels (our "
                "chunked kernels in FP32, checked against HF's scan on each layer's first segment of the run; "
                "faster), auto: kernels with the triton backend, hf with torch", ("auto", "hf", "kernels"))
    output: str | None = option(None, "output directory (default reports/kl-<model>-<UTC time>/)")
    resume: str | None = option(None, "continue the interrupted run in this directory")
    keep_token_metrics: bool = option(False, "keep the per-token metrics (tokens/*.npz) after the run completes")


@dataclass(frozen=True)
class SensitivityConfig(KLConfig):
    """Options of `replayssm-eval sensitivity`: the kl options (the text, lengths, buckets, device) and the study's."""

    config: tuple[str, ...] = option(("nvfp4/fp16sr",), "the one config studied, e.g. nvfp4/fp16sr")
    heads: int = option(0, "also measure each head of this many most sensitive layers (with --budget: and choose "
                           "their configs per head)")
    budget: str | None = option(None, "choose per-layer configs (per head in the --heads layers) under this SSM state "
                                      "traffic per decode token: bytes (a number > 1) or a fraction of conventional "
                                      "FP32's (0 < f <= 1), then run them")
    candidates: tuple[str, ...] = option((), "configs a layer or head may take under --budget besides --config "
                                             "and FP32")
    output: str | None = option(None, "output directory (default reports/sensitivity-<model>-<UTC time>/)")
    resume: str | None = option(None, "continue the interrupted study in this directory")

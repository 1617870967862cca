"""The fixed numerics suite of `replayssm-eval regress`: every number is deterministic (fixed seeds, CPU).

    from replayssm_eval.regress.suite import run_suite
    metrics = run_suite()          # {name: {"kind": ..., "value": ...}}

Parts (metric names start with the part):
- `format/<fmt>/<distribution>/rel_rms`: round-trip error of every state format
  (`quant.measure.format_error_table`) on random Gaussian and Mamba-2-like states.
- `bits/<fmt>`: SHA-256 (16 hex digits) of the packed bytes (codes, block scales, global scales)
  of a state built from integers only, so every input value and every rounding is exact IEEE
  arithmetic: any change of a rounding mode, a scale or a packing changes it.
- `kernel/<family>/<config>/{y,hi}_rel_rms`: this package's Triton decode step (under
  TRITON_INTERPRET=1 on the CPU) against `decode_reference`, token by token from sequences at
  different phases (`conformance.run_case`); `kernel/<family>/chunked_triton/...`: the Triton
  chunked kernel against the torch chunked form.
- `chunked/<family>/<config>/{y,hi}_rel_rms`: the teacher-forced chunked form against the
  step-by-step reference.
- `kl/<model>/<config>/<start>-<end>`: mean KL of the bundled tiny models at 256 generated
  tokens (1 document, prompt 64) per length bucket, through the KL driver (`kl.run_kl`).

Tolerances are per kind (`TOLERANCES`, see docs/regress.md), never per baseline entry, so a
baseline update cannot loosen them.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import io
import os
import tempfile
import time
from dataclasses import dataclass

import torch

SUITE_VERSION = 1
PARTS = ("format", "bits", "kernel", "chunked", "kl")

# every registered format plus the options the kernels treat differently
FORMATS = ("fp32", "bf16", "fp16", "fp16sr", "fp8", "fp8sr", "fp8e5m2", "nvfp4", "mxfp8", "mxfp4",
           "nvfp4:scale=row", "nvfp4:axis=headdim,scale=head", "fp8:scale=head", "fp8sr:scale=tensor",
           "mxfp4:axis=headdim")
FORMAT_GEOMETRY = (4, 32, 64)
DISTRIBUTIONS = ("gaussian", "ssm")
SR_SEED = 1234
KERNEL_CONFIGS = ("fp16", "shared:nvfp4@4", "nvfp4/fp16sr@4", "nvfp4/fp8sr@4", "nvfp4/fp16sr@4#closed")
CHUNKED_CONFIGS = ("shared:nvfp4@4", "nvfp4/fp16sr@4", "nvfp4/fp8sr@8", "fp16/fp32@4", "nvfp4/fp16sr@4#closed")
CHUNKED_TRITON_CONFIGS = ("nvfp4:scale=row/fp16sr@4", "shared:fp8sr:scale=head@4")
KL_RUNS = {
    "tiny-nemotron-h": ("fp16", "shared:nvfp4", "nvfp4/fp16sr", "nvfp4/fp8sr"),
    "tiny-qwen3.5": ("shared:nvfp4", "nvfp4/fp16sr#closed", "nvfp4/fp8sr"),
}
KL_OPTIONS = {"tokens": 256, "prompt_len": 64, "num_docs": 1, "buckets": "1,16,64", "segment_len": 64}


@dataclass(frozen=True)
class Tolerance:
    """How far a metric may move from its baseline: |current - baseline| <= atol + rtol |baseline|.

    exact: compared for equality (hashes). lower_is_better: the direction that is an improvement
    (errors and KL); a move beyond the tolerance the other way is a regression.
    """

    rtol: float = 0.0
    atol: float = 0.0
    exact: bool = False
    lower_is_better: bool = True
    why: str = ""

    def describe(self) -> str:
        if self.exact:
            return "exact"
        return f"atol {self.atol:g} + rtol {self.rtol:g}"


TOLERANCES = {
    "bits": Tolerance(exact=True, why="integer-built input, exact IEEE rounding and integer packing: bit equality"),
    "format_error": Tolerance(rtol=1e-4, why="elementwise rounding of torch.randn states and one FP64 norm; "
                              "ulp-level differences of randn between CPU builds move it far less"),
    "kernel_error": Tolerance(rtol=9.0, atol=1e-5, why="two FP32 summation orders (Triton interpreter via numpy "
                              "vs torch): noise of ~1e-7; a state element rounded the other way (one FP16 ulp) "
                              "gives ~3e-6; a real bug (a lost term, a wrong scale) gives >1e-3"),
    "chunked_error": Tolerance(rtol=9.0, atol=1e-5, why="as kernel_error: the chunked and step forms sum in "
                               "different orders"),
    "kl": Tolerance(rtol=0.1, atol=1e-6, why="the tiny models run matmuls on the CPU's BLAS: other CPUs "
                    "change logits at 1e-6 and can flip a stored element; a format bug moves KL by far more"),
}
KINDS = {"format": "format_error", "bits": "bits", "kernel": "kernel_error", "chunked": "chunked_error", "kl": "kl"}


def run_suite(parts: tuple[str, ...] = PARTS, log=None, only: tuple[str, ...] = ()) -> dict[str, dict]:
    """Compute the metrics of `parts`: {name: {"kind", "value"}}, sorted by name.

    only: glob patterns of metric names (fnmatch); cases with no selected metric are not run.
    """
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown suite part {unknown[0]!r}; known: {', '.join(PARTS)}")
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels run on CPU tensors
    select = (lambda name: any(fnmatch.fnmatchcase(name, p) for p in only)) if only else (lambda name: True)
    metrics = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only cost time (and one thread fixes the sum order)
    try:
        for part in parts:
            start = time.perf_counter()
            values = {k: v for k, v in _PART_FUNCTIONS[part](select).items() if select(k)}
            for name, value in values.items():
                metrics[name] = {"kind": KINDS[part], "value": value}
            if log:
                log(f"{part}: {len(values)} metrics in {time.perf_counter() - start:.1f} s")
    finally:
        torch.set_num_threads(threads)
    return dict(sorted(metrics.items()))


def format_metrics(select) -> dict[str, float]:
    from replayssm_eval.quant.measure import format_error_table

    out = {}
    for distribution in DISTRIBUTIONS:
        rows = format_error_table(list(FORMATS), FORMAT_GEOMETRY, distribution=distribution, seed=SR_SEED, states=2)
        for spec, row in zip(FORMATS, rows):
            out[f"format/{spec}/{distribution}/rel_rms"] = row["rel_rms_error"]
    return out


def integer_state(shape=(2, 3, 16, 48)) -> torch.Tensor:
    """An FP32 state whose every value is an integer times an exact power of two (no rounding anywhere).

    A multiplicative hash of the flat index gives a 20-bit signed mantissa and an exponent in
    [-12, 11]; each head is scaled by a further 2^(4h) so heads differ in magnitude; every 7th
    block of 16 along the last dim is zero (zero blocks take the formats' special paths).
    """
    idx = torch.arange(torch.Size(shape).numel(), dtype=torch.int64)
    h = (idx * 2654435761) % (1 << 32)
    mantissa = ((h >> 8) % (1 << 20)) - (1 << 19)
    powers = torch.tensor([2.0 ** e for e in range(-40, 41)], dtype=torch.float32)
    exponent = (h % 24) - 12 - 19  # the mantissa is a 20-bit integer
    x = mantissa.to(torch.float32) * powers[exponent + 40]
    x = x.view(shape) * powers[4 * torch.arange(shape[-3]) + 40].view(-1, 1, 1)
    blocks = torch.arange(shape[-1]) // 16
    return torch.where((blocks % 7 == 3), 0.0, x)


def bits_metrics(select) -> dict[str, str]:
    from replayssm_eval.formats import get_format

    x = integer_state()
    out = {}
    for spec in FORMATS:
        fmt = get_format(spec)
        packed = fmt.encode(x, seed=SR_SEED if fmt.is_stochastic else None)
        digest = hashlib.sha256()
        for t in packed.tensors():
            if t is not None:
                digest.update(str(t.dtype).encode() + str(tuple(t.shape)).encode())
                digest.update(t.contiguous().view(torch.uint8).numpy().tobytes())
        out[f"bits/{spec}"] = digest.hexdigest()[:16]
    return out


def kernel_metrics(select) -> dict[str, float]:
    from replayssm_eval.replay.config import ReplayConfig
    from replayssm_eval.kernels.family import get_family
    from replayssm_eval.regress import conformance

    out = {}
    for family in conformance.FAMILIES:
        for text in KERNEL_CONFIGS:
            if "#closed" in text and not get_family(family).closed_fold:
                continue
            if not _wanted(select, f"kernel/{family}/{text}"):
                continue
            case = conformance.Case(family, text, "small", 0)
            result = conformance.run_case(conformance.triton_adapter, case)
            out[f"kernel/{family}/{text}/y_rel_rms"] = result.y_rel_rms
            out[f"kernel/{family}/{text}/hi_rel_rms"] = result.hi_rel_rms
        for text in CHUNKED_TRITON_CONFIGS:
            if not _wanted(select, f"kernel/{family}/chunked_triton/{text}"):
                continue
            config = ReplayConfig.parse(text)
            y_ref, st_ref, y, st = _chunked_pair(family, config, backends=("torch", "triton"))
            out[f"kernel/{family}/chunked_triton/{text}/y_rel_rms"] = conformance.rel_rms(y_ref, y)
            out[f"kernel/{family}/chunked_triton/{text}/hi_rel_rms"] = conformance.rel_rms(st_ref.hi, st.hi)
    return out


def chunked_metrics(select) -> dict[str, float]:
    from replayssm_eval.replay.config import ReplayConfig
    from replayssm_eval.kernels.family import get_family
    from replayssm_eval.regress import conformance

    out = {}
    for family in conformance.FAMILIES:
        for text in CHUNKED_CONFIGS:
            if ("#closed" in text and not get_family(family).closed_fold) or not _wanted(select, f"chunked/{family}/{text}"):
                continue
            y_ref, st_ref, y, st = _chunked_pair(family, ReplayConfig.parse(text), backends=("step", "torch"))
            out[f"chunked/{family}/{text}/y_rel_rms"] = conformance.rel_rms(y_ref, y)
            out[f"chunked/{family}/{text}/hi_rel_rms"] = conformance.rel_rms(st_ref.hi, st.hi)
    return out


def _chunked_pair(family, config, backends):
    """Two paths over 3L + 5 tokens from a phased state: "step" (decode_reference) or a chunked backend."""
    from replayssm_eval.kernels.family import get_family
    from replayssm_eval.regress import conformance

    batch = get_family(family).test_shapes["grouped"]["B"]
    warm = conformance.warmup_lengths(batch, config.window)
    tokens = 3 * config.window + 5
    inputs, anchor = conformance.make_inputs(family, "grouped", 0, max(warm) + tokens)
    state = conformance.phased_state(family, inputs, anchor, config, warm)
    index = torch.tensor(warm)[:, None] + torch.arange(tokens)
    main = {k: (conformance._take(v, index) if v.dim() > 1 else v) for k, v in inputs.items()}
    results = []
    for backend in backends:
        if backend == "step":
            results += conformance.reference_decode(family, main, state, config)
        else:
            results += conformance.chunked_decode(family, main, state, config, backend=backend)
    return results


def kl_metrics(select) -> dict[str, float]:
    from replayssm_eval.replay.config import ReplayConfig
    from replayssm_eval.kl import KLConfig, run_kl
    from replayssm_eval.results.files import read_json

    out = {}
    for model, configs in KL_RUNS.items():
        configs = tuple(c for c in configs if _wanted(select, f"kl/{model}/{ReplayConfig.parse(c).name}", buckets=True))
        if not configs:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            options = KLConfig(model=model, config=configs, device="cpu", dtype="float32", backend="torch",
                               output=os.path.join(tmp, "run"), **KL_OPTIONS)
            with contextlib.redirect_stderr(io.StringIO()):  # progress bar
                run_dir = run_kl(options)
            report = read_json(run_dir / "kl.json")
        for config in report["configs"]:
            for b in config["buckets"]:
                out[f"kl/{model}/{config['name']}/{b['start']}-{b['end']}"] = b["kl_mean"]
    return out


def _wanted(select, prefix: str, buckets: bool = False) -> bool:
    """Whether any metric of the case `prefix` is selected."""
    if buckets:
        starts = [int(s) for s in KL_OPTIONS["buckets"].split(",")]
        ends = [s - 1 for s in starts[1:]] + [KL_OPTIONS["tokens"]]
        return any(select(f"{prefix}/{a}-{b}") for a, b in zip(starts, ends))
    return any(select(f"{prefix}/{m}") for m in ("y_rel_rms", "hi_rel_rms"))


_PART_FUNCTIONS = {"format": format_metrics, "bits": bits_metrics, "kernel": kernel_metrics,
                   "chunked": chunked_metrics, "kl": kl_metrics}

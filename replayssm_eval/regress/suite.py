"""The fixed numerics suite of `replayssm-eval regress`: every number is deterministic (fixed seeds, CPU).

    from replayssm_eval.regress.suite import run_suite, metric_kinds
    metrics = run_suite()          # {name: {"kind": ..., "value": ...}}
    metric_kinds(("bits",))        # {name: kind} of every metric of a part, without computing any

Parts (metric names start with the part):
- `format/<fmt>/<distribution>/rel_rms`: round-trip error of every state format and option
  (`formats.measure.format_error_table`) on random Gaussian and Mamba-2-like states.
- `bits/<fmt>` and `bits/<fmt>/ties`: SHA-256 (16 hex digits) of the packed bytes (codes, scales) of
  `golden.integer_state` and of `golden.tie_state` (values on rounding midpoints); `bits/<fmt>/scale_order`: NVFP4
  block scales that differ from TransformerEngine's order on the golden rows; `bits/buffer/<dtype>`: the `#buf=`
  rounding of both states. Every input value is exact, so any change of a rounding mode, a tie rule, a scale
  or a packing changes them.
- `kernel/<family>/<config>/{y,hi}_rel_rms`: this package's Triton decode step (under TRITON_INTERPRET=1 on
  the CPU) against `decode_reference`, token by token from sequences at different phases
  (`conformance.run_case`); `.../ref_rel_rms`: `decode_reference` under the config against FP32
  (what the config's rounding costs); `kernel/<family>/chunked_triton/...`: the Triton chunked kernel against
  the torch chunked form; `kernel/encode/<fmt>/<input>`: the hash of the Triton encoder's bytes (as `bits`).
- `chunked/<family>/<config>/{y,hi}_rel_rms`: the teacher-forced chunked form against the step-by-step
  reference.
- `kl/<model>/<config>/<start>-<end>[/reverse]`: mean KL (and the reverse KL) of the bundled tiny models per
  length bucket, through the KL driver (`kl.run_kl`); `kl/formula/...`, `kl/buckets/...`: the KL formulas and
  bucket statistics, the t-interval among them, on hand-made inputs (`fixed_cases`). The model runs' intervals
  are not metrics: over 2 documents the interval is the mean +- 12.7 x half the documents' difference, clipped
  at 0, and that difference moves with the float noise another CPU's BLAS puts in the forward (docs/regress.md).
- `stats/accuracy/...`, `stats/loop/...`: accuracy.json's statistics and the loop detector on hand-made
  inputs (`fixed_cases`).

Tolerances are per kind (`TOLERANCES`, see docs/regress.md), never per baseline entry, so a
baseline update cannot loosen them.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from replayssm_eval.regress import fixed_cases, golden

SUITE_VERSION = 2
PARTS = ("format", "bits", "kernel", "chunked", "kl", "stats")

# every registered format and every option value the formats treat differently
FORMATS = ("fp32", "bf16", "fp16", "fp16sr", "fp16sr:rounds=7",
           "fp8", "fp8sr", "fp8e5m2", "fp8:scale=head", "fp8sr:scale=tensor", "fp8:scale=block:16", "fp8:scale=rowcol",
           "fp8:scale=none", "fp8:max=240", "fp8e5m2:scale=head,max=1024", "fp8sr:bits=12", "fp8sr:rounds=7",
           "int8", "int8sr", "int16", "int16sr", "int8:scale=head", "int8:scale=tensor", "int8:scale=block:16",
           "int8:scale=rowcol", "int8:scale=none", "int8:axis=headdim", "int16:scale=block:32", "int8sr:bits=8",
           "int16sr:rounds=7,bits=24", "int16sr:words=quad", "fp8sr:words=duo", "mx8sr:words=quad",
           "nvfp4", "nvfp4:scale=row", "nvfp4:scale=tensor", "nvfp4:scale=rowcol", "nvfp4:axis=headdim,scale=head",
           "mxfp8", "mxfp4", "mxfp4:axis=headdim", "mxfp8:axis=headdim",
           "mx8", "mx8sr", "mx8:axis=headdim", "dualaxis", "dualaxis:width=8", "dualaxis:axis=dstate,width=4",
           "int8:rot=hadamard:16", "int8sr:axis=headdim,rot=hadamard:16", "fp8:rot=hadamard:16",
           "nvfp4:rot=hadamard:16",  # hadamard:16: 1/4 is exact, so the rotated integer state is exact in FP64
           # sglang:fp8; tiles that split the golden and random heads (16 and 32 rows); 2-D tiles, shorter at the edges
           "fp8:scale=tile:32x0,max=240", "fp8:scale=tile:4x0,max=240", "int8:scale=tile:6x20")
NVFP4_SCALE_ORDER = ("nvfp4", "nvfp4:scale=row", "nvfp4:scale=tensor")  # one golden row per state: one global group
BUFFER_DTYPES = ("bf16", "fp16")
FORMAT_GEOMETRY = (4, 32, 64)
DISTRIBUTIONS = ("gaussian", "ssm")
SR_SEED = 1234
KERNEL_CONFIGS = ("fp16", "shared:nvfp4@4", "nvfp4/fp16sr@4", "nvfp4/fp8sr@4", "nvfp4/fp16sr@4#closed",
                  "fp32@4#buf=bf16", "fp32@4#closed#buf=fp16")
CHUNKED_CONFIGS = ("shared:nvfp4@4", "nvfp4/fp16sr@4", "nvfp4/fp8sr@8", "fp16/fp32@4", "nvfp4/fp16sr@4#closed",
                   "fp32@4#buf=fp16", "fp32@4#closed#buf=bf16")
CHUNKED_TRITON_CONFIGS = ("nvfp4:scale=row/fp16sr@4", "shared:fp8sr:scale=head@4", "fp32@4#buf=bf16")
# the Triton encoder (a flush's checkpoint write) on the golden inputs: formats of FORMATS, so the hashes equal `bits`
ENCODE_FORMATS = ("nvfp4", "nvfp4:scale=row", "nvfp4:scale=tensor", "fp8", "fp8:scale=head", "fp8:scale=none",
                  "fp8:max=240", "fp8e5m2:scale=head,max=1024", "fp16", "bf16", "fp8:scale=tile:32x0,max=240",
                  "int8:scale=block:16", "int8:axis=headdim", "nvfp4:axis=headdim,scale=head", "nvfp4:scale=rowcol",
                  "int8:rot=hadamard:16", "mx8:axis=headdim")
KL_RUNS = {
    "tiny-nemotron-h": ("fp16", "shared:nvfp4", "nvfp4/fp16sr", "nvfp4/fp8sr"),
    # SGLang's FP8 pool with 16-row tiles (its 32-row tile is a whole head of this model), error feedback, a
    # prefix-cache hit (sglang:int8-pool) and a paged prefix cache
    "tiny-qwen3.5": ("shared:nvfp4", "nvfp4/fp16sr#closed", "nvfp4/fp8sr", "fp8:scale=tile:16x0,max=240",
                     "shared:int8:ef=fp32", "sglang:int8-pool", "fp16#rt=int8:axis=headdim@every:32"),
}
KL_OPTIONS = {"tokens": 128, "prompt_len": 64, "num_docs": 2, "buckets": "1,16,64", "segment_len": 64}


@dataclass(frozen=True)
class Tolerance:
    """How far a metric may move from its baseline: |current - baseline| <= atol + rtol |baseline|.

    exact: compared for equality (hashes, counts). lower_is_better: the direction that is an improvement
    (errors), a move beyond the tolerance the other way is a regression; None: a fixed value (an interval,
    a p-value, a rate, the cost a rounding must have), a move either way is a regression.
    """

    rtol: float = 0.0
    atol: float = 0.0
    exact: bool = False
    lower_is_better: bool | None = True
    why: str = ""

    def describe(self) -> str:
        if self.exact:
            return "exact"
        return f"atol {self.atol:g} + rtol {self.rtol:g}" + ("" if self.lower_is_better is not None else " both ways")


TOLERANCES = {
    "bits": Tolerance(exact=True, why="exact inputs, exact IEEE rounding and integer packing: bit equality"),
    "format_error": Tolerance(rtol=1e-4, why="elementwise rounding of torch.randn states and one FP64 norm; "
                              "ulp-level differences of randn between CPU builds move it far less"),
    "kernel_error": Tolerance(rtol=9.0, atol=1e-5, why="two FP32 summation orders (Triton interpreter via numpy "
                              "vs torch): noise of ~1e-7; a state element rounded the other way (one FP16 ulp) "
                              "gives ~3e-6; a real bug (a lost term, a wrong scale, an unrounded buffer) gives >1e-4"),
    "chunked_error": Tolerance(rtol=9.0, atol=1e-5, why="as kernel_error: the chunked and step forms sum in "
                               "different orders"),
    "reference_error": Tolerance(rtol=0.03, lower_is_better=None, why="the reference's error against FP32: a few "
                                 "thousand stored elements, one rounded the other way on another CPU moves it "
                                 "< 0.5%; a dropped or wrong rounding moves it by 2x or more"),
    "kl": Tolerance(rtol=0.2, atol=1e-6, lower_is_better=None, why="the tiny models run matmuls on the CPU's "
                    "BLAS: other CPUs change logits at 1e-6 and can flip a stored element (KL moves a few percent); "
                    "a format bug moves KL by far more, either way (a rounding skipped costs nothing)"),
    "statistic": Tolerance(rtol=1e-5, atol=1e-6, lower_is_better=None, why="hand-made small-integer inputs: "
                           "FP32 exp/log differ between CPUs by a few ulps (< 1e-6); a wrong formula (direction, "
                           "degrees of freedom, bucket, threshold) moves a value by > 1%"),
}


@dataclass(frozen=True)
class Case:
    """One computation of the suite: its metrics (name -> kind) and `compute(names)`, the values of (at least) the
    metrics named."""

    metrics: dict[str, str]
    compute: Callable[[set[str]], dict]


def metric_kinds(parts: tuple[str, ...] = PARTS) -> dict[str, str]:
    """{name: kind} of every metric of `parts`, nothing computed."""
    _check_parts(parts)
    return {name: kind for part in parts for case in _PART_CASES[part]() for name, kind in case.metrics.items()}


def run_suite(parts: tuple[str, ...] = PARTS, log=None, only: tuple[str, ...] = ()) -> dict[str, dict]:
    """Compute the metrics of `parts`: {name: {"kind", "value"}}, sorted by name.

    only: glob patterns of metric names (fnmatch); cases with no selected metric are not run.
    """
    _check_parts(parts)
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels run on CPU tensors
    select = (lambda name: any(fnmatch.fnmatchcase(name, p) for p in only)) if only else (lambda name: True)
    metrics = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only cost time (and one thread fixes the sum order)
    try:
        with warnings.catch_warnings():  # numpy's overflow and 0/0 in the interpreter's masked-out lanes (a GPU is silent)
            warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
            for part in parts:
                start, count = time.perf_counter(), 0
                for case in _PART_CASES[part]():
                    wanted = {name for name in case.metrics if select(name)}
                    if wanted:
                        values = case.compute(wanted)
                        metrics.update({name: {"kind": case.metrics[name], "value": values[name]} for name in wanted})
                        count += len(wanted)
                if log:
                    log(f"{part}: {count} metrics in {time.perf_counter() - start:.1f} s")
    finally:
        torch.set_num_threads(threads)
    return dict(sorted(metrics.items()))


def _check_parts(parts) -> None:
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown suite part {unknown[0]!r}; known: {', '.join(PARTS)}")


def _case(kind: str, compute: Callable[[], dict], names) -> Case:
    """A Case whose metrics all have `kind` and whose `compute` takes no selection (cheap: computes them all)."""
    return Case(dict.fromkeys(names, kind), lambda wanted: compute())


def _computed(kind: str, compute: Callable[[], dict]) -> Case:
    """A Case of a hand-made computation that takes well under a second: computed now, its names being its keys."""
    values = compute()
    return Case(dict.fromkeys(values, kind), lambda wanted: values)


def format_cases() -> list[Case]:
    names = [f"format/{spec}/{d}/rel_rms" for d in DISTRIBUTIONS for spec in FORMATS]
    return [_case("format_error", format_metrics, names)]


def format_metrics() -> dict[str, float]:
    from replayssm_eval.formats.measure import format_error_table

    out = {}
    for distribution in DISTRIBUTIONS:
        rows = format_error_table(list(FORMATS), FORMAT_GEOMETRY, distribution=distribution, seed=SR_SEED, states=2)
        for spec, row in zip(FORMATS, rows):
            out[f"format/{spec}/{distribution}/rel_rms"] = row["rel_rms_error"]
    return out


def bits_cases() -> list[Case]:
    names = [f"bits/{spec}{suffix}" for spec in FORMATS for suffix in ("", "/ties")]
    names += [f"bits/{spec}/scale_order" for spec in NVFP4_SCALE_ORDER] + [f"bits/buffer/{d}" for d in BUFFER_DTYPES]
    return [_case("bits", bits_metrics, names)]


def bits_metrics() -> dict[str, str | int]:
    from replayssm_eval.formats import get_format
    from replayssm_eval.replay.config import ReplayConfig

    states = {"": golden.integer_state(), "/ties": golden.tie_state()}
    out = {}
    for spec in FORMATS:
        fmt = get_format(spec)
        for suffix, x in states.items():
            out[f"bits/{spec}{suffix}"] = golden.digest(fmt.encode(x, seed=SR_SEED if fmt.is_stochastic else None).tensors())
    x, scales = golden.scale_order_rows()
    for spec in NVFP4_SCALE_ORDER:
        out[f"bits/{spec}/scale_order"] = int((get_format(spec).encode(x).scales.view(scales.shape) != scales).sum())
    for dtype in BUFFER_DTYPES:
        config = ReplayConfig.parse(f"fp32@4#buf={dtype}")
        out[f"bits/buffer/{dtype}"] = golden.digest(config.round_buffered(s) for s in states.values())
    return out


def _families(configs):
    """(family, config text) of every family, closed-fold configs only where the family has that fold."""
    from replayssm_eval.kernels.family import get_family
    from replayssm_eval.regress import conformance

    return [(family, text) for family in conformance.FAMILIES for text in configs
            if "#closed" not in text or get_family(family).closed_fold]


def kernel_cases() -> list[Case]:
    cases = []
    for family, text in _families(KERNEL_CONFIGS):
        prefix = f"kernel/{family}/{text}"
        metrics = {f"{prefix}/y_rel_rms": "kernel_error", f"{prefix}/hi_rel_rms": "kernel_error",
                   f"{prefix}/ref_rel_rms": "reference_error"}
        cases.append(Case(metrics, lambda wanted, family=family, text=text: _kernel_case(family, text, wanted)))
    for family, text in _families(CHUNKED_TRITON_CONFIGS):
        prefix = f"kernel/{family}/chunked_triton/{text}"
        cases.append(_case("kernel_error", lambda family=family, text=text, prefix=prefix: _chunked_case(
            family, text, ("torch", "triton"), prefix), (f"{prefix}/y_rel_rms", f"{prefix}/hi_rel_rms")))
    names = [f"kernel/encode/{spec}/{name}" for spec in ENCODE_FORMATS for name in ("integer", "ties")]
    names += [f"kernel/encode/{spec}/scale_order" for spec in ENCODE_FORMATS if spec in NVFP4_SCALE_ORDER]
    return cases + [_case("bits", encode_metrics, names)]


def _kernel_case(family: str, text: str, wanted: set[str]) -> dict[str, float]:
    from replayssm_eval.regress import conformance

    prefix, out = f"kernel/{family}/{text}", {}
    if wanted - {f"{prefix}/ref_rel_rms"}:
        result = conformance.run_case(conformance.triton_adapter, conformance.Case(family, text, "small", 0))
        out.update({f"{prefix}/y_rel_rms": result.y_rel_rms, f"{prefix}/hi_rel_rms": result.hi_rel_rms})
    if f"{prefix}/ref_rel_rms" in wanted:
        out[f"{prefix}/ref_rel_rms"] = reference_error(family, text)
    return out


def reference_error(family: str, text: str) -> float:
    """rel RMS of `decode_reference`'s outputs under config `text` against FP32 (no rounding), 3L + 5 tokens."""
    from replayssm_eval.regress import conformance
    from replayssm_eval.replay.config import ReplayConfig

    config = ReplayConfig.parse(text)
    inputs, anchor = conformance.make_inputs(family, "small", 0, 3 * config.window + 5)
    y, _ = conformance.reference_decode(family, inputs, anchor, config)
    y_fp32, _ = conformance.reference_decode(family, inputs, anchor, ReplayConfig.parse(f"fp32@{config.window}"))
    return conformance.rel_rms(y_fp32, y)


def encode_metrics() -> dict[str, str | int]:
    """`kernel/encode/<fmt>/<input>`: the Triton encoder's bytes on the golden inputs (as `bits`)."""
    from replayssm_eval.formats import get_format
    from replayssm_eval.formats.triton import encode_triton

    out = {}
    for spec in ENCODE_FORMATS:
        for name, x in (("integer", golden.integer_state()), ("ties", golden.tie_state())):
            out[f"kernel/encode/{spec}/{name}"] = golden.digest(encode_triton(x, get_format(spec)).tensors())
    x, scales = golden.scale_order_rows()
    for spec in NVFP4_SCALE_ORDER:
        got = encode_triton(x, get_format(spec)).scales.view(scales.shape)
        out[f"kernel/encode/{spec}/scale_order"] = int((got != scales).sum())
    return out


def chunked_cases() -> list[Case]:
    cases = []
    for family, text in _families(CHUNKED_CONFIGS):
        prefix = f"chunked/{family}/{text}"
        cases.append(_case("chunked_error", lambda family=family, text=text, prefix=prefix: _chunked_case(
            family, text, ("step", "torch"), prefix), (f"{prefix}/y_rel_rms", f"{prefix}/hi_rel_rms")))
    return cases


def _chunked_case(family: str, text: str, backends: tuple[str, str], prefix: str) -> dict[str, float]:
    """Two paths over 3L + 5 tokens from a phased state: "step" (decode_reference) or a chunked backend."""
    from replayssm_eval.kernels.family import get_family
    from replayssm_eval.regress import conformance
    from replayssm_eval.replay.config import ReplayConfig

    config = ReplayConfig.parse(text)
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
    y_ref, st_ref, y, st = results
    return {f"{prefix}/y_rel_rms": conformance.rel_rms(y_ref, y), f"{prefix}/hi_rel_rms": conformance.rel_rms(st_ref.hi, st.hi)}


_KL_STATISTICS = {"": "kl_mean", "/reverse": "reverse_kl_mean"}  # metric suffix -> bucket statistic


def kl_cases() -> list[Case]:
    from replayssm_eval.replay.config import ReplayConfig
    from replayssm_eval.results.buckets import parse_buckets

    buckets = parse_buckets(KL_OPTIONS["buckets"], KL_OPTIONS["tokens"])
    cases = []
    for model, configs in KL_RUNS.items():
        metrics = {f"kl/{model}/{ReplayConfig.parse(c).name}/{b.start}-{b.end}{suffix}": "kl"
                   for c in configs for b in buckets for suffix in _KL_STATISTICS}
        cases.append(Case(metrics, lambda wanted, model=model, configs=configs: _kl_run(model, configs, wanted)))
    return cases + [_computed("statistic", fixed_cases.kl_formula_metrics), _computed("statistic", fixed_cases.kl_bucket_metrics)]


def _kl_run(model: str, configs: tuple[str, ...], wanted: set[str]) -> dict[str, float]:
    from replayssm_eval.kl import KLConfig, run_kl
    from replayssm_eval.replay.config import ReplayConfig
    from replayssm_eval.results.files import read_json

    configs = tuple(c for c in configs if any(n.startswith(f"kl/{model}/{ReplayConfig.parse(c).name}/") for n in wanted))
    with tempfile.TemporaryDirectory() as tmp:
        options = KLConfig(model=model, config=configs, device="cpu", dtype="float32", backend="torch",
                           output=os.path.join(tmp, "run"), **KL_OPTIONS)
        with contextlib.redirect_stderr(io.StringIO()):  # progress bar
            run_dir = run_kl(options)
        report = read_json(run_dir / "kl.json")
    return {f"kl/{model}/{config['name']}/{b['start']}-{b['end']}{suffix}": b[key]
            for config in report["configs"] for b in config["buckets"] for suffix, key in _KL_STATISTICS.items()}


def stats_cases() -> list[Case]:
    return [_computed("statistic", fixed_cases.accuracy_metrics), _computed("statistic", fixed_cases.loop_metrics)]


_PART_CASES = {"format": format_cases, "bits": bits_cases, "kernel": kernel_cases, "chunked": chunked_cases,
               "kl": kl_cases, "stats": stats_cases}

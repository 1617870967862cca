"""Conformance of a decode kernel with `decode_reference`: `replayssm-eval regress --kernel module:function`.

An external ReplaySSM decode kernel (vLLM, FlashInfer, TensorRT-LLM, ...) is wrapped by its user in
an adapter that decodes ONE token for a batch of sequences:

    def adapter(family: str, inputs: dict[str, torch.Tensor], state: ReplayState, config: ReplayConfig)
            -> tuple[torch.Tensor, ReplayState]

family   the kernel family's name (`kernels.family.family_names()`); `get_family(family)` describes it.
inputs   the token's layer inputs {name: tensor} for the names of the family's `inputs`, FP32, on the
         run's device, shaped as its `shapes` without the time dim (per-head parameters as they are).
state    the layer's `replay.ReplayState` before the token (sequences at different window
         phases): hi / lo the FP32 values of S_hi / S_lo (in the family's stored layout),
         lo_packed the read copy's bytes as the kernel reads them (`quant.PackedState`), buffer
         the entries since the checkpoint (each [B, capacity, ...]; the family's `_common` says
         which), schedule.count the entries per sequence, checkpoint the checkpoint index,
         seq_ids and layer the keys of the SR bits.
config   the `ReplayConfig` (formats, window L, SR seed, GDN fold, skip threshold).
returns  the token's output without the time dim (one of size 1 is accepted) and the ReplayState
         after the token. The adapter converts to and from the engine's own cache layout. Raise
         NotImplementedError("why") for a family or config the kernel does not support: the case
         is reported as skipped.

Every case decodes 2L + 3 tokens from sequences at different phases, through the adapter token by
token and through `decode_reference` (FP32), and checks:
- the outputs: RMS error over all tokens / RMS of the reference <= Y_TOL;
- the stored copies after the last token: at most STATE_FLIPS of the elements of S_hi and S_lo
  differ from the reference by more than STATE_RTOL x max|ref| (two FP32 paths that sum in
  different orders put an element within an ulp of a rounding boundary on different sides now
  and then; a wrong rounding mode, scale or kernel changes far more elements);
- checkpoint indices and buffered-entry counts equal the reference's exactly.
Stochastic rounding must follow the Philox keying of `replay.keys` (as ReplaySSM specifies), or
the SR configs fail: leave them out with `--kernel-configs`.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.family import family_names, get_family
from replayssm_eval.replay.state import ReplayState, write_checkpoint_packed

FAMILIES = family_names()
Y_TOL = 1e-3
STATE_RTOL = 1e-5
STATE_FLIPS = 0.02
LAYER = 2  # a layer index and sequence ids other than 0.. catch adapters that ignore the SR keys
SEQ_ID_BASE = 5

_CONFIGS = ("fp32", "fp16", "shared:nvfp4@{L}", "nvfp4/fp32@{L}", "nvfp4/fp16sr@{L}", "nvfp4/fp8sr@{L}",
            "fp8/fp16sr@{L}", "bf16/fp16@{L}", "nvfp4:scale=row/fp16sr@{L}#skip=0.3", "fp32@{L}#buf=bf16")
_GDN_EXTRA = ("nvfp4/fp16sr@{L}#closed", "shared:nvfp4@{L}#closed", "fp32@{L}#closed#buf=fp16")
GRIDS = {
    # configs (with {L} for each window), windows, shapes, seeds
    "full": {"configs": _CONFIGS + _GDN_EXTRA, "windows": (4, 16), "shapes": ("small", "grouped"), "seeds": (0, 1)},
    "quick": {"configs": ("fp16", "shared:nvfp4@{L}", "nvfp4/fp16sr@{L}", "nvfp4/fp8sr@{L}", "nvfp4/fp16sr@{L}#closed",
                          "fp32@{L}#buf=bf16"),
              "windows": (4,), "shapes": ("small",), "seeds": (0,)},
}

Adapter = Callable[[str, dict, ReplayState, ReplayConfig], tuple[torch.Tensor, ReplayState]]


@dataclass(frozen=True)
class Case:
    family: str
    config: str
    shape: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.family} {self.config} {self.shape} seed={self.seed}"


@dataclass(frozen=True)
class CaseResult:
    case: Case
    status: str  # pass | FAIL | skipped
    y_rel_rms: float | None = None
    hi_flips: float | None = None
    lo_flips: float | None = None
    hi_rel_rms: float | None = None
    message: str = ""


def load_adapter(spec: str) -> Adapter:
    """`module:function` (importable) or `path/to/file.py:function`."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--kernel {spec!r}: expected module:function or path/to/file.py:function")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"--kernel {spec!r}: no file {module_name}")
        loaded = importlib.util.spec_from_file_location(f"_replayssm_adapter_{path.stem}", path)
        module = importlib.util.module_from_spec(loaded)
        sys.modules[loaded.name] = module
        loaded.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"--kernel {spec!r}: cannot import {module_name}: {err}") from err
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"--kernel {spec!r}: {module_name} has no function {attr!r}")
    return fn


def grid_cases(grid: str = "full", families=None, configs: tuple[str, ...] = ()) -> list[Case]:
    """The cases of a named grid for `families` (default: every registered family); `configs` (ReplayConfig strings,
    {L} allowed) replaces the grid's configs."""
    if grid not in GRIDS:
        raise ValueError(f"unknown conformance grid {grid!r}; known: {', '.join(GRIDS)}")
    known = family_names()
    unknown = [f for f in families or known if f not in known]
    if unknown:
        raise ValueError(f"unknown family {unknown[0]!r}; known: {', '.join(known)}")
    families = families or known
    spec = GRIDS[grid]
    cases = []
    for family in families:
        for template in configs or spec["configs"]:
            if "#closed" in template and not get_family(family).closed_fold:
                continue
            windows = spec["windows"] if "{L}" in template else (None,)
            names = dict.fromkeys(template.format(L=w) for w in windows)  # a config without {L}: once
            for text in names:
                for shape in spec["shapes"]:
                    for seed in spec["seeds"]:
                        config = ReplayConfig.parse(text)
                        if seed:
                            config = config.replace(seed=seed)
                        cases.append(Case(family, config.name, shape, seed))
    return cases


def make_inputs(family: str, shape: str, seed: int, tokens: int, device="cpu") -> tuple[dict, torch.Tensor]:
    """Random layer inputs for `tokens` tokens (each [B, T, ...]) and the FP32 state at the anchor.

    shape: a name of the family's `test_shapes` ("small", "grouped")."""
    fam = get_family(family)
    gen = torch.Generator().manual_seed(1000 + seed)
    inputs, anchor = fam.random_inputs(fam.test_shapes[shape], tokens, gen)
    return {k: v.to(device) for k, v in inputs.items()}, anchor.to(device)


def step_inputs(family: str, inputs: dict, n: int) -> dict:
    """Token n of every sequence: time dims dropped; per-head parameters (A, D) as they are."""
    return {k: (v[:, n] if v.dim() > 1 else v) for k, v in inputs.items()}


def reference_decode(family: str, inputs: dict, state, config: ReplayConfig, *, layer_idx=LAYER, seq_ids=None):
    """`decode_reference` of the family over all tokens of `inputs`: (y [B, T, ...], ReplayState)."""
    fam = get_family(family)
    return fam.decode_reference(*(inputs[k] for k in fam.inputs), state, config, layer_idx=layer_idx, seq_ids=seq_ids)


def chunked_decode(family: str, inputs: dict, state, config: ReplayConfig, backend="torch"):
    """The family's teacher-forced `chunked` over all tokens of `inputs`: (y, ReplayState)."""
    fam = get_family(family)
    return fam.chunked(*(inputs[k] for k in fam.inputs), state, config, layer_idx=state.layer, backend=backend)


def phased_state(family: str, inputs: dict, anchor: torch.Tensor, config: ReplayConfig, warmup: list[int]):
    """The ReplayState after sequence b decoded warmup[b] < L tokens alone (no flush yet), with its packed read copy."""
    batch = anchor.shape[0]
    seq_ids = torch.arange(SEQ_ID_BASE, SEQ_ID_BASE + batch, device=anchor.device)
    parts = []
    for b in range(batch):
        one = {k: (v[b:b + 1, :warmup[b]] if v.dim() > 1 else v) for k, v in inputs.items()}
        _, st = reference_decode(family, one, anchor[b:b + 1], config, seq_ids=seq_ids[b:b + 1])
        parts.append(st)
    state = _stack_states(parts)
    # no flush during the warm-up: the read copy is still checkpoint 0, written from the anchor
    hi, lo, packed = write_checkpoint_packed(get_family(family).stored_layout(anchor).float(), config, LAYER, seq_ids,
                                             torch.zeros(batch, dtype=torch.int64, device=anchor.device))
    assert torch.equal(hi, state.hi) and torch.equal(lo, state.lo), "warm-up must not flush"
    return replace(state, lo_packed=packed)


def _stack_states(parts: list[ReplayState]) -> ReplayState:
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
    schedule = type(parts[0].schedule)(*(torch.cat([getattr(p.schedule, f) for p in parts])
                                         for f in ("count", "step_left", "step_read_hi", "steps")))
    buffer = {k: torch.cat([p.buffer[k] for p in parts]) for k in parts[0].buffer}
    return ReplayState(cat("hi"), cat("lo"), buffer, schedule, cat("checkpoint"), cat("seq_ids"), parts[0].layer)


def warmup_lengths(batch: int, window: int) -> list[int]:
    """Different phases per sequence, each before its first flush."""
    return [(b * (window // 2 + 1)) % window for b in range(batch)]


def run_case(adapter: Adapter, case: Case, device="cpu") -> CaseResult:
    """Decode 2L + 3 tokens through `adapter` and the reference from the same phased state and compare."""
    config = ReplayConfig.parse(case.config)
    window = config.window
    batch = get_family(case.family).test_shapes[case.shape]["B"]
    warm = warmup_lengths(batch, window)
    tokens = 2 * window + 3
    inputs, anchor = make_inputs(case.family, case.shape, case.seed, max(warm) + tokens, device)
    state = phased_state(case.family, inputs, anchor, config, warm)
    # every sequence continues from its own warm-up end; inputs past it are shifted to start there
    index = torch.tensor(warm, device=anchor.device)[:, None] + torch.arange(tokens, device=anchor.device)  # [B, T]
    main = {k: (_take(v, index) if v.dim() > 1 else v) for k, v in inputs.items()}
    y_ref, st_ref = reference_decode(case.family, main, state, config)
    ys, st = [], state
    try:
        for n in range(tokens):
            y, st = adapter(case.family, step_inputs(case.family, main, n), st, config)
            ys.append(y.reshape(y_ref[:, n].shape))
    except NotImplementedError as err:
        return CaseResult(case, "skipped", message=str(err) or "not supported by the adapter")
    return compare_runs(case, y_ref, torch.stack(ys, 1), st_ref, st)


def _take(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t [B, T0, ...] at time indices index [B, T]."""
    return torch.stack([t[b, index[b]] for b in range(t.shape[0])])


def rel_rms(ref: torch.Tensor, got: torch.Tensor) -> float:
    """RMS of the error over RMS of the reference (0 when both are zero)."""
    ref, got = ref.double(), got.double().to(ref.device)
    norm = ref.norm().item()
    err = (got - ref).norm().item()
    return err / norm if norm else (0.0 if err == 0 else math.inf)


def flip_fraction(ref: torch.Tensor, got: torch.Tensor, rtol: float = STATE_RTOL) -> float:
    """Fraction of elements of `got` beyond rtol x max|ref| from `ref` (NaN counts)."""
    ref, got = ref.double(), got.double().to(ref.device)
    bound = rtol * ref.abs().max().item()
    bad = ~((got - ref).abs() <= bound)
    return bad.double().mean().item()


def compare_runs(case: Case, y_ref, y, st_ref: ReplayState, st: ReplayState) -> CaseResult:
    problems = []
    if y.shape != y_ref.shape:
        return CaseResult(case, "FAIL", message=f"output shape {list(y.shape)}, expected {list(y_ref.shape)}")
    y_err = rel_rms(y_ref, y)
    hi_flips, lo_flips = flip_fraction(st_ref.hi, st.hi), flip_fraction(st_ref.lo, st.lo)
    if not y_err <= Y_TOL:
        per_token = [rel_rms(y_ref[:, n], y[:, n]) for n in range(y.shape[1])]
        first = next(n for n, e in enumerate(per_token) if not e <= Y_TOL)
        problems.append(f"outputs: RMS error ratio {y_err:.3e} > {Y_TOL:.0e} "
                        f"(first at token {first}: {per_token[first]:.3e})")
    for name, flips in (("S_hi", hi_flips), ("S_lo", lo_flips)):
        if not flips <= STATE_FLIPS:
            problems.append(f"{name}: {flips:.1%} of elements differ (allowed {STATE_FLIPS:.0%})")
    if not torch.equal(st.checkpoint.cpu(), st_ref.checkpoint.cpu()):
        problems.append(f"checkpoint indices {st.checkpoint.tolist()}, expected {st_ref.checkpoint.tolist()}")
    if not torch.equal(st.schedule.count.cpu(), st_ref.schedule.count.cpu()):
        problems.append(f"buffered entries {st.schedule.count.tolist()}, expected {st_ref.schedule.count.tolist()}")
    return CaseResult(case, "FAIL" if problems else "pass", y_err, hi_flips, lo_flips, rel_rms(st_ref.hi, st.hi),
                      "; ".join(problems))


def check_kernel(adapter: Adapter, cases: list[Case], device="cpu", progress=None) -> list[CaseResult]:
    results = []
    for case in cases:
        results.append(run_case(adapter, case, device))
        if progress:
            progress(results[-1])
    return results


def format_results(results: list[CaseResult]) -> str:
    """A fixed-width table, one row per case, failures explained under it."""
    head = f"{'status':7} {'case':52} {'y rel RMS':>10} {'S_hi flips':>10} {'S_lo flips':>10}"
    lines = [head, "-" * len(head)]
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for r in results:
        lines.append(f"{r.status:7} {r.case.name:52} {fmt(r.y_rel_rms, '10.2e')} {fmt(r.hi_flips, '10.2%')} "
                     f"{fmt(r.lo_flips, '10.2%')}")
    failed = [r for r in results if r.status != "pass"]
    for r in failed:
        lines.append(f"{r.status}: {r.case.name}: {r.message}")
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "FAIL", "skipped")}
    lines.append(f"{counts['pass']} passed, {counts['FAIL']} failed, {counts['skipped']} skipped")
    return "\n".join(lines)


def triton_adapter(family: str, inputs: dict, state: ReplayState, config: ReplayConfig):
    """This package's Triton decode step as an adapter (the suite's kernel-vs-reference check)."""
    fam = get_family(family)
    one = {k: (v[:, None] if v.dim() > 1 else v) for k, v in inputs.items()}
    y, new_state = fam.decode_step(*(one[k] for k in fam.inputs), state, config, layer_idx=state.layer)
    return y[:, 0], new_state

"""GPU benchmark of the ReplaySSM kernels: decode-step time and bandwidth, chunked teacher-forced throughput.

    python benchmarks/kernel_speed.py --out out/kernels.json               # H200: both families, about 3-4 minutes
    python benchmarks/kernel_speed.py --quick                               # GPU smoke run (batches 1, 256; short sequences)
    python benchmarks/kernel_speed.py --skip-chunked --families kda --batches 256 --sweeps flush  # one phase's launch sweep
    python benchmarks/kernel_speed.py --skip-chunked --families gdn --batches 256 --sweeps non-flush --sweep-reads nvfp4
    TRITON_INTERPRET=1 python benchmarks/kernel_speed.py --tiny --device cpu  # CPU: tiny shapes, checks the script runs

Geometries (each family's `models.presets.full_size_preset`): Mamba-2 of Nemotron-3-Nano-4B (H=96, P=80, N=128, G=8), GDN of Qwen3.5-4B (HV=32, H=16, K=V=128),
KDA of Kimi-Linear-48B-A3B (H=HV=32, K=V=128; `--families kda`); FP32 recurrence state; batches 1, 32, 128, 256. What it measures (kernel time only, `triton.testing.do_bench`,
median, L2 flushed before every run; inputs, buffers and packed copies are prepared once outside the timing;
the ReplaySSM kernels are timed by replaying the exact launch `decode_step_triton` makes, without its host work):

1. copy: torch device-to-device copy of a 1 GiB buffer, (bytes read + written) / time: the bandwidth ceiling.
2. decode step, per family and batch (bytes = what the step must move: state copies read / written, the buffer
   entries read, the new inputs and the output; GB/s = bytes / time, % of the copy bandwidth):
   conventional            `conventional_step`: FP32 state read, updated, written back in place (window 1)
   conventional (replay@1) the ReplaySSM step kernel with config fp32 (window 1), for reference
   non-flush fp32 read     shared:fp32@16, mid-window (8 buffered entries, the window's mean): checkpoint + buffer
   non-flush nvfp4 read    nvfp4/fp32@16, the same with the packed NVFP4 read copy (codes + scales)
                           (both: the single-token kernel `_replay_step_kernel`; the tune rows sweep its launch config
                           at the largest batch, the default first, and the rows use the best one where
                           batch x heads >= 4096; KDA's step launches its per-head terms kernel first, timed with it)
   flush                   the 16th step: S_hi + 16 entries read, the FP32 fold written (for each config; the
                           folding kernel swept as the non-flush one: KDA's `_replay_fold_kernel`, GDN's
                           `_replay_step_kernel` in its folding launch)
   flush packing (torch)   write_checkpoint_packed of the fold (host-side torch pass of decode_step_triton)
   amortised L=16          (15 x non-flush + flush) / 16, and the speedup of conventional over it
3. chunked: `chunked(..., backend="triton")` with an in-kernel config (nvfp4/fp16sr@16, per-head scales) and the
   torch backend on the tensor-scale nvfp4 (nvfp4:scale=tensor/fp16sr@16, backend="torch"), tokens/s per layer at batch 1 over 16K, 32K and
   128K tokens (a length is skipped, not extrapolated, when it would not fit the time budget), against
   step-by-step decoding through the decode-step kernels of the same config (512 tokens: an eager launch loop,
   and the same launches replayed from a CUDA graph) and through the public `decode_step_triton`.

Every measurement is guarded: an error (out of memory, compile error) is recorded in its row and the run goes on.
The script prints rows as they come, then the tables and the speed goals beside the measured values, and writes
JSON with --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

from replayssm_eval.kernels.delta._common import from_format_layout  # noqa: E402
from replayssm_eval.kernels.family import family_names, get_family  # noqa: E402
from replayssm_eval.kernels.gdn import triton_step as gdn_triton  # noqa: E402
from replayssm_eval.kernels.kda import triton_step as kda_triton  # noqa: E402
from replayssm_eval.kernels.mamba2 import triton_step as mamba2_triton  # noqa: E402
from replayssm_eval.models.presets import PRESETS, full_size_preset  # noqa: E402
from replayssm_eval.replay.config import ReplayConfig  # noqa: E402
from replayssm_eval.replay.schedule import ScheduleState  # noqa: E402
from replayssm_eval.replay.state import ReplayState, write_checkpoint_packed, zero_residual  # noqa: E402

WINDOW = 16
MID = WINDOW // 2 - 1  # committed entries of the timed non-flush step: it reads 8 entries, the mean over a window
FP32_READ, NVFP4_READ, CONVENTIONAL = "shared:fp32@16", "nvfp4/fp32@16", "fp32"
CHUNK_TRITON, CHUNK_TORCH = "nvfp4/fp16sr@16", "nvfp4:scale=tensor/fp16sr@16"
SWEEPS = ("non-flush", "flush")  # the step kernels' phases whose launches the tune rows sweep
SWEEP_READS = {"fp32": FP32_READ, "nvfp4": NVFP4_READ}  # the read copies the tune rows sweep, by name
GOALS = {"replay_vs_conv": 1.5, "conv_bw": 0.80, "nvfp4_vs_fp32": 2.5, "flush_vs_conv": 1.5, "chunk_vs_step": 50.0}
F32 = 4


def log(*parts):
    print(*parts, flush=True)


# ---------------------------------------------------------------------------------------------- timing


class Timer:
    """Kernel timing: do_bench (events, median, L2 flushed) on CUDA; perf_counter medians on CPU (smoke runs)."""

    def __init__(self, device: str, quick: bool):
        self.cuda = device.startswith("cuda")
        self.warmup, self.rep = (5, 25) if quick else (10, 60)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def kernel_ms(self, fn) -> float:
        if self.cuda:
            return float(triton.testing.do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median"))
        fn()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return 1e3 * sorted(times)[1]

    def wall_s(self, fn) -> float:
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0


class _Recorder:
    """Stands in for a `@triton.jit` kernel: records each launch (name, grid, args, kwargs) into `calls` and runs it."""

    def __init__(self, kernel, name: str, calls: list):
        self.kernel, self.name, self.calls = kernel, name, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((self.name, grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch


def captured_launch(module, kernel_name, call, prepare=()):
    """Run `call()` with module.<kernel_name> (and the kernels named in `prepare`) recorded; return a function that
    replays its launches, and call()'s result.

    kernel_name: one name or a tuple of names (the public function launches exactly one of them, after any launches of
    `prepare`, which the replay repeats first: KDA's per-head terms). The replay launches the very kernels, grids and
    arguments the public function launched, without its host work; the returned function carries `.kernel` (the name
    launched) and `.launch` (grid, args, kwargs) for launch-config sweeps, which `.relaunch(grid, kwargs)` replays
    with another grid and launch config.
    """
    names = (kernel_name,) if isinstance(kernel_name, str) else tuple(kernel_name)
    calls = []
    recs = {n: _Recorder(getattr(module, n), n, calls) for n in names + tuple(prepare)}
    for n, rec in recs.items():
        setattr(module, n, rec)
    try:
        result = call()
    finally:
        for n, rec in recs.items():
            setattr(module, n, rec.kernel)
    steps = [c for c in calls if c[0] in names]
    if len(steps) != 1 or calls[-1] is not steps[0]:
        raise RuntimeError(f"expected one launch of {' or '.join(names)}, last, saw {[c[0] for c in calls]}")
    n, grid, args, kwargs = steps[0]
    before = [(getattr(module, m), g, a, kw) for m, g, a, kw in calls[:-1]]

    def relaunch(new_grid, new_kwargs):
        for kernel, g, a, kw in before:
            kernel[g](*a, **kw)
        return getattr(module, n)[new_grid](*args, **new_kwargs)

    def replay():
        return relaunch(grid, kwargs)
    replay.kernel, replay.launch, replay.relaunch = n, (grid, args, kwargs), relaunch
    return replay, result


# ---------------------------------------------------------------------------------------------- results


class Results:
    def __init__(self, budget_s: float):
        self.rows: list[dict] = []
        self.start = time.perf_counter()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def add(self, row: dict, fn=None) -> dict:
        """Run fn(row) (fills the measured fields) under a guard; an exception becomes the row's error. On a GPU the
        row's launches run inside an NVTX range named as the row's line starts (`section family name B=batch`), which
        Nsight Compute selects with `--nvtx --nvtx-include "decode gdn non-flush nvfp4 read B=256/"`."""
        row.setdefault("error", None)
        if fn is not None:
            try:
                with nvtx_range(_row_head(row)):
                    fn(row)
            except Exception as err:  # noqa: BLE001 - one failing row must not lose the others
                row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
                if "out of memory" in str(err).lower():
                    torch.cuda.empty_cache()
        self.rows.append(row)
        log(f"[{self.elapsed():6.1f}s] " + _row_line(row))
        return row

    def find(self, **keys) -> dict | None:
        for row in self.rows:
            if all(row.get(k) == v for k, v in keys.items()) and row.get("error") is None:
                return row
        return None


def nvtx_range(name: str):
    """An NVTX range on a GPU (for Nsight Compute's --nvtx-include), else nothing."""
    return torch.cuda.nvtx.range(name) if torch.cuda.is_available() else contextlib.nullcontext()


def _row_head(row: dict) -> str:
    head = f"{row.get('section')} {row.get('family', '')} {row.get('name')}"
    if row.get("batch") is not None:
        head += f" B={row['batch']}"
    if row.get("tokens") is not None:
        head += f" T={row['tokens']}"
    return head


def _row_line(row: dict) -> str:
    head = _row_head(row)
    if row.get("error"):
        return f"{head}: ERROR {row['error']}"
    parts = [f"{k}={_fmt(row[k])}" for k in ("ms", "gbps", "pct_copy", "tokens_per_s", "seconds", "check")
             if row.get(k) is not None]
    if row.get("note"):
        parts.append(f"({row['note']})")
    return head + ": " + " ".join(parts)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def relerr(ref: torch.Tensor, got: torch.Tensor) -> float:
    ref, got = ref.double(), got.double()
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


# ---------------------------------------------------------------------------------------------- inputs


class Rand:
    def __init__(self, device: str, seed: int = 0):
        self.device = device
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, *shape, scale=1.0):
        return scale * torch.randn(*shape, generator=self.gen, device=self.device)


def _schedule(batch: int, count: int, device) -> ScheduleState:
    zeros = torch.zeros(batch, dtype=torch.int64, device=device)
    return ScheduleState(torch.full((batch,), count, dtype=torch.int64, device=device), zeros,
                         torch.zeros(batch, dtype=torch.bool, device=device), zeros.clone())


def anchored_state(s0: torch.Tensor, config: str, buffer: dict, count: int) -> ReplayState:
    """Layer-0 ReplayState of sequences 0..B-1: checkpoint 0 written from s0 (and zero error-feedback residuals),
    `buffer` at window phase `count`."""
    batch, device = s0.shape[0], s0.device
    seq_ids = torch.arange(batch, device=device)
    ckpt = torch.zeros(batch, dtype=torch.int64, device=device)
    cfg = ReplayConfig.parse(config)
    residual = zero_residual(cfg, tuple(s0.shape), device)
    hi, lo, packed = write_checkpoint_packed(s0, cfg, 0, seq_ids, ckpt, residual)
    return ReplayState(hi, lo, buffer, _schedule(batch, count, device), ckpt, seq_ids, 0, packed, residual)


def _valid(t: torch.Tensor, count: int) -> torch.Tensor:
    """Zero the buffer entries past `count` (dim 1), as a real buffer holds them."""
    t[:, count:] = 0
    return t


def flush_packing(folded: torch.Tensor, config: str):
    """The host-side part of a flush, as `decode_step_triton` runs it: round both copies, pack the read copy."""
    cfg = ReplayConfig.parse(config)
    batch = folded.shape[0]
    seq_ids = torch.arange(batch, device=folded.device)
    ckpt = torch.ones(batch, dtype=torch.int64, device=folded.device)
    return lambda: write_checkpoint_packed(folded, cfg, 0, seq_ids, ckpt)


class Mamba2:
    name = "mamba2"
    step_keys = ("BLOCK_P", "TILES", "num_warps")  # the launch config of `_replay_step_kernel` the tune rows vary
    tiny = dict(H=4, P=20, N=32, G=2)

    @staticmethod
    def dims(geo) -> dict:
        """The driver's sizes of a `models.presets.ModelGeometry`."""
        return dict(H=geo.num_heads, P=geo.head_dim, N=geo.state_dim, G=geo.n_groups)

    def __init__(self, geo: dict, rand: Rand):
        self.H, self.P, self.N, self.G = geo["H"], geo["P"], geo["N"], geo["G"]
        self.kernels = get_family(self.name)
        self.rand = rand
        self.A = -torch.exp(rand(self.H, scale=0.5))
        self.A[: self.H // 4] = -0.02
        self.D = rand(self.H)

    @property
    def state_heads(self) -> int:
        """Heads of the state: the step kernels' grid dimension 1."""
        return self.H

    def stored_shape(self, batch: int) -> tuple[int, ...]:
        """A layer's stored copy, [B, H, P, N]."""
        return (batch, self.H, self.P, self.N)

    def state_elems(self) -> int:
        return self.H * self.P * self.N

    def token_bytes(self, entries: int) -> int:
        """Bytes of a step besides the state copies: `entries` buffer entries (x, B, dt; the new token's included), C, y."""
        return F32 * (entries * (self.H * self.P + self.G * self.N + self.H) + self.G * self.N + self.H * self.P)

    def token(self, batch: int, tokens: int | None = None):
        """x, dt, B, C of new tokens: [B, H, P] ... for tokens=None, else with a T dim."""
        t = () if tokens is None else (tokens,)
        r = self.rand
        dt = torch.nn.functional.softplus(r(batch, *t, self.H) - 1.0)
        return r(batch, *t, self.H, self.P), dt, r(batch, *t, self.G, self.N), r(batch, *t, self.G, self.N)

    def fp32_state(self, batch: int) -> torch.Tensor:
        return self.rand(batch, self.H, self.P, self.N, scale=3.0)

    def replay_state(self, s0: torch.Tensor, config: str, count: int) -> ReplayState:
        """A ReplayState at window phase `count` (entries 0..count-1 committed), checkpoint written from s0."""
        batch, cap, r = s0.shape[0], ReplayConfig.parse(config).window, self.rand
        buffer = {"x": _valid(r(batch, cap, self.H, self.P), count), "B": _valid(r(batch, cap, self.G, self.N), count),
                  "dt": _valid(torch.nn.functional.softplus(r(batch, cap, self.H) - 1.0), count)}
        return anchored_state(s0, config, buffer, count)

    def step_launch(self, state: ReplayState, config: str):
        """The kernel launch of decode_step_triton for one token from `state`: `_replay_step_kernel` when no sequence
        flushes at this step (the single-token non-flush kernel), else `_replay_kernel`."""
        x, dt, B, C = self.token(state.batch)
        return captured_launch(mamba2_triton, ("_replay_kernel", "_replay_step_kernel"),
                               lambda: self.kernels.decode_step(x[:, None], dt[:, None], self.A, B[:, None], C[:, None], self.D, state, config))

    def step_variants(self) -> list[dict]:
        """Launch configs of `_replay_step_kernel` the tune rows sweep (the non-flush step at the largest batch)."""
        out = []
        for block_p in (8, 16, 32):
            for tiles in sorted({1, triton.cdiv(self.P, block_p)}):
                for warps in ((1, 4, 8) if block_p == 32 else (1, 4)):
                    out.append(dict(BLOCK_P=block_p, TILES=tiles, num_warps=warps))
        return out

    def step_variant(self, launch, cfg: dict):
        return step_variant(mamba2_triton, launch, cfg, self.state_heads, self.P, cfg["BLOCK_P"])

    fold_kernel = "_replay_step_kernel"  # a flush is the step kernel's folding launch
    fold_keys = step_keys

    def fold_variants(self) -> list[dict]:
        """Launch configs of the folding `_replay_step_kernel` the flush tune rows sweep: rows per tile, tiles per
        program, warps."""
        return [dict(BLOCK_P=block_p, TILES=tiles, num_warps=warps) for block_p in (8, 16, 32)
                for tiles in sorted({1, 2, triton.cdiv(self.P, block_p)}) for warps in (1, 2, 4)]

    def fold_variant(self, launch, cfg: dict):
        return self.step_variant(launch, cfg)

    def conventional(self, batch: int, block: int):
        s = self.fp32_state(batch)
        x, dt, B, C = self.token(batch)
        return lambda: self.kernels.conventional_step(x, dt, self.A, B, C, self.D, s, block_p=block)

    def check_conventional(self, batch: int = 2) -> float:
        s = self.fp32_state(batch)
        x, dt, B, C = self.token(batch)
        y_ref, st = self.kernels.decode_reference(x[:, None], dt[:, None], self.A, B[:, None], C[:, None], self.D, s, CONVENTIONAL)
        s_got = s.clone()
        y = self.kernels.conventional_step(x, dt, self.A, B, C, self.D, s_got)
        return max(relerr(y_ref[:, 0], y), relerr(st.hi, s_got))

    packing = staticmethod(flush_packing)

    def sequence(self, tokens: int, batch: int = 1):
        x, dt, B, C = self.token(batch, tokens)
        return (x, dt, self.A, B, C, self.D, self.fp32_state(batch))

    def chunked(self, inputs, config: str, backend: str):
        return self.kernels.chunked(*inputs, config, backend=backend)

    def public_steps(self, inputs, config: str, tokens: int):
        x, dt, A, B, C, D, s0 = inputs
        state = s0
        for t in range(tokens):
            _, state = mamba2_triton.decode_step_triton(x[:, t], dt[:, t], A, B[:, t], C[:, t], D, state, config)


class GDN:
    name = "gdn"
    step_keys = ("BLOCK_V", "BLOCK_K", "TILES", "WORDS", "num_warps")
    tiny = dict(HV=4, H=2, K=32, V=24)

    @staticmethod
    def dims(geo) -> dict:
        """The driver's sizes of a `models.presets.ModelGeometry`: value heads, key heads, K, V."""
        return dict(HV=geo.num_heads, H=geo.n_groups, K=geo.state_dim, V=geo.head_dim)

    def __init__(self, geo: dict, rand: Rand):
        self.HV, self.H, self.K, self.V = geo["HV"], geo["H"], geo["K"], geo["V"]
        self.kernels = get_family(self.name)
        self.rand = rand

    @property
    def state_heads(self) -> int:
        """Value heads: the step kernels' grid dimension 1 (H is the q, k heads)."""
        return self.HV

    def stored_shape(self, batch: int) -> tuple[int, ...]:
        """A layer's stored copy, [B, HV, V, K] (the formats' layout)."""
        return (batch, self.HV, self.V, self.K)

    def state_elems(self) -> int:
        return self.HV * self.K * self.V

    def token_bytes(self, entries: int) -> int:
        """Bytes of a step besides the state copies: entries - 1 committed entries (k, u, g), the new token's
        q, k, v, g, beta, and its u and o."""
        committed = (entries - 1) * (self.H * self.K + self.HV * self.V + self.HV)
        return F32 * (committed + 2 * self.H * self.K + self.HV * self.V + 2 * self.HV + 2 * self.HV * self.V)

    def token(self, batch: int, tokens: int | None = None):
        """q, k [B, (T,) H, K] (L2-normalised, q scaled by K^-0.5), v [B, (T,) HV, V], g (< 0), beta in (0, 1)."""
        t = () if tokens is None else (tokens,)
        r = self.rand
        q = torch.nn.functional.normalize(r(batch, *t, self.H, self.K), dim=-1) * self.K ** -0.5
        k = torch.nn.functional.normalize(r(batch, *t, self.H, self.K), dim=-1)
        g = -torch.nn.functional.softplus(r(batch, *t, self.HV) - 3.0)
        beta = torch.sigmoid(r(batch, *t, self.HV))
        return q, k, r(batch, *t, self.HV, self.V), g, beta

    def fp32_state(self, batch: int) -> torch.Tensor:
        """[B, HV, V, K] (the stored layout)."""
        return self.rand(batch, self.HV, self.V, self.K)

    def replay_state(self, s0: torch.Tensor, config: str, count: int) -> ReplayState:
        batch, cap, r = s0.shape[0], ReplayConfig.parse(config).window, self.rand
        k = torch.nn.functional.normalize(r(batch, cap, self.H, self.K), dim=-1)
        buffer = {"k": _valid(k, count), "u": _valid(r(batch, cap, self.HV, self.V, scale=0.3), count),
                  "g": _valid(-torch.nn.functional.softplus(r(batch, cap, self.HV) - 3.0), count)}
        return anchored_state(s0, config, buffer, count)

    def step_launch(self, state: ReplayState, config: str):
        """The kernel launch of decode_step_triton for one token from `state`: `_replay_step_kernel` (non-flush and
        flush sequences alike)."""
        q, k, v, g, beta = self.token(state.batch, 1)
        return captured_launch(gdn_triton, "_replay_step_kernel",
                               lambda: self.kernels.decode_step(q, k, v, g, beta, state, config))

    def step_variants(self) -> list[dict]:
        """Launch configs of `_replay_step_kernel` the tune rows sweep (the non-flush step at the largest batch): rows
        per tile, columns per pass, tiles per program, NVFP4 codes as words or bytes (the FP32 read ignores it), warps;
        the row-wise launches first, where a short budget still times them."""
        rows, tiles = [], []
        k = max(16, triton.next_power_of_2(self.K))
        for block_v in (16, 32, 64, 128):
            for block_k in sorted({min(64, k), k}):  # K in chunks of 64, or whole
                for t in sorted({1, triton.cdiv(self.V, block_v)}):
                    for words in (0, 1):
                        for warps in ((4, 8) if block_v * block_k >= 4096 else (2, 4)):
                            tiles.append(dict(BLOCK_V=block_v, BLOCK_K=block_k, TILES=t, WORDS=words, num_warps=warps))
                    if block_k == min(64, k) and block_v >= 32:  # rows summed by their threads: one row a thread,
                        for warps in sorted({block_v // 32, 1}):  # or several (one warp)
                            rows.append(dict(BLOCK_V=block_v, BLOCK_K=block_k, TILES=t, WORDS=2, num_warps=warps))
        return rows + tiles

    def step_variant(self, launch, cfg: dict):
        return step_variant(gdn_triton, launch, cfg, self.state_heads, self.V, cfg["BLOCK_V"])

    fold_kernel = "_replay_step_kernel"  # a flush is the step kernel's folding launch
    fold_keys = ("BLOCK_V", "BLOCK_K", "TILES", "num_warps")

    def fold_variants(self) -> list[dict]:
        """Launch configs of the folding `_replay_step_kernel` the flush tune rows sweep: rows per tile (at least 16:
        the open fold's buffer sum is a tl.dot), columns per pass (the row dots', and the fold's by columns), tiles per
        program, warps."""
        return [dict(BLOCK_V=block_v, BLOCK_K=block_k, TILES=tiles, num_warps=warps)
                for block_v in (16, 32, 64) for block_k in (32, 64)
                for tiles in sorted({1, triton.cdiv(self.V, block_v)}) for warps in (1, 2, 4)]

    def fold_variant(self, launch, cfg: dict):
        return self.step_variant(launch, cfg)

    def conventional(self, batch: int, block: int):
        s = self.fp32_state(batch)
        q, k, v, g, beta = self.token(batch)
        return lambda: self.kernels.conventional_step(q, k, v, g, beta, s, block_v=block)

    def check_conventional(self, batch: int = 2) -> float:
        s = self.fp32_state(batch)
        q, k, v, g, beta = self.token(batch)
        o_ref, st = self.kernels.decode_reference(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                  from_format_layout(s).contiguous(), CONVENTIONAL)
        s_got = s.clone()
        o = self.kernels.conventional_step(q, k, v, g, beta, s_got)
        return max(relerr(o_ref[:, 0], o), relerr(st.hi, s_got))

    packing = staticmethod(flush_packing)

    def sequence(self, tokens: int, batch: int = 1):
        q, k, v, g, beta = self.token(batch, tokens)
        return (q, k, v, g, beta, from_format_layout(self.fp32_state(batch)).contiguous())

    def chunked(self, inputs, config: str, backend: str):
        return self.kernels.chunked(*inputs, config, backend=backend)

    def public_steps(self, inputs, config: str, tokens: int):
        q, k, v, g, beta, s0 = inputs
        state = s0
        for t in range(tokens):
            sl = slice(t, t + 1)
            _, state = self.kernels.decode_step(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], state, config)


class KDA(GDN):
    """Kimi Delta Attention: GDN's layout with a per-channel decay g [.., HV, K]; its own step kernel launch."""

    name = "kda"
    step_keys = ("BLOCK_V", "BLOCK_K", "WORDS", "TERMS", "num_warps", "maxnreg")
    dims = staticmethod(GDN.dims)

    def token_bytes(self, entries: int) -> int:
        """As GDN's, with g of K values per value head (committed entries and the new token)."""
        committed = (entries - 1) * (self.H * self.K + self.HV * self.V + self.HV * self.K)
        return F32 * (committed + 2 * self.H * self.K + self.HV * self.V + self.HV * self.K + self.HV
                      + 2 * self.HV * self.V)

    def _decay(self, *shape):
        """Per-channel log decay: softplus-shaped rates, some channels slow, some fast."""
        return -torch.nn.functional.softplus(self.rand(*shape) - 3.0)

    def token(self, batch: int, tokens: int | None = None):
        q, k, v, _, beta = super().token(batch, tokens)
        t = () if tokens is None else (tokens,)
        return q, k, v, self._decay(batch, *t, self.HV, self.K), beta

    def replay_state(self, s0: torch.Tensor, config: str, count: int) -> ReplayState:
        batch, cap, r = s0.shape[0], ReplayConfig.parse(config).window, self.rand
        k = torch.nn.functional.normalize(r(batch, cap, self.H, self.K), dim=-1)
        buffer = {"k": _valid(k, count), "u": _valid(r(batch, cap, self.HV, self.V, scale=0.3), count),
                  "g": _valid(self._decay(batch, cap, self.HV, self.K), count)}
        return anchored_state(s0, config, buffer, count)

    def step_launch(self, state: ReplayState, config: str, step_config: dict | None = None):
        """The kernel launch of decode_step_triton for one token from `state`: `_replay_fold_kernel` when a sequence
        flushes, else `_replay_step_kernel`, after the head terms' launch where the step makes one. step_config: the
        reading launch's config in place of `step_launch_config`'s. The launch carries `.with_step_config(cfg)`, the
        same step captured with another (`step_variant`)."""
        q, k, v, g, beta = self.token(state.batch, 1)
        default = kda_triton.step_launch_config
        if step_config is not None:
            kda_triton.step_launch_config = lambda *args: step_config
        try:
            launch, out = captured_launch(kda_triton, ("_replay_step_kernel", "_replay_fold_kernel"),
                                          lambda: self.kernels.decode_step(q, k, v, g, beta, state, config),
                                          prepare=("_head_terms_kernel",))
        finally:
            kda_triton.step_launch_config = default
        launch.with_step_config = lambda cfg: self.step_launch(state, config, cfg)[0]
        return launch, out

    def step_variants(self) -> list[dict]:
        """Launch configs of `_replay_step_kernel` the non-flush tune rows sweep (a fold runs `_replay_fold_kernel`):
        state rows per program, columns per pass, NVFP4 codes as words or bytes, whether a program computes its
        head's terms (TERMS: whole heads, no head terms launch), warps."""
        k = max(16, triton.next_power_of_2(self.K))
        v = max(16, triton.next_power_of_2(self.V))
        tiles = [dict(BLOCK_V=block_v, BLOCK_K=block_k, WORDS=words, num_warps=warps)
                 for block_v in (16, 32, 64) for block_k in sorted({32, 64, k}) for words in (0, 1)
                 for warps in (2, 4) if block_v * block_k <= 8192]
        rows = [dict(BLOCK_V=block_v, BLOCK_K=32, WORDS=2, num_warps=warps) for block_v in (32, 64, 128)
                for warps in sorted({block_v // 32, 1})]  # a row a thread, or several
        # whole heads with their terms: rows summed by their threads (four rows a thread in one warp, capped or not,
        # or two in two warps), or in tiles of words
        heads = [dict(BLOCK_V=v, BLOCK_K=32, WORDS=2, TERMS=True, num_warps=1, maxnreg=regs) for regs in (None, 128)]
        heads += [dict(BLOCK_V=v, BLOCK_K=32, WORDS=2, TERMS=True, num_warps=max(1, v // 64))]
        heads += [dict(BLOCK_V=v, BLOCK_K=64, WORDS=1, TERMS=True, num_warps=warps) for warps in (4, 8)]
        # the row-wise launches first, where a short budget still times them; none capped (the default is timed first)
        return [{key: {"TERMS": False, "maxnreg": None, **cfg}[key] for key in self.step_keys}
                for cfg in rows + heads + tiles]

    def step_variant(self, launch, cfg: dict):
        """The step captured with the reading launch config cfg: with TERMS, no head terms launch where no row folds."""
        return launch.with_step_config(cfg)

    fold_kernel = "_replay_fold_kernel"
    fold_keys = ("BLOCK_V", "BLOCK_K", "STAGES", "num_warps", "maxnreg")

    def fold_variants(self) -> list[dict]:
        """Launch configs of `_replay_fold_kernel` the flush tune rows sweep: state rows per program (each the whole
        of K), columns per pass (the packed read copy's, the open fold's), the open fold's passes in flight, warps;
        last the 64-row programs with registers capped (more programs an SM) and whole heads in one program (the
        head's keys read once), all slower on an H100 (BENCHMARKS.md, Decode step)."""
        capped = [dict(BLOCK_V=64, BLOCK_K=block_k, STAGES=stages, num_warps=4, maxnreg=regs)
                  for regs in (128, 96) for block_k in (64, 32) for stages in (3, 4)]
        whole = [dict(BLOCK_V=128, BLOCK_K=block_k, STAGES=3, num_warps=8) for block_k in (32, 64)]
        return [dict(BLOCK_V=block_v, BLOCK_K=block_k, STAGES=stages, num_warps=warps)
                for stages in (2, 3, 1) for block_v in (32, 16, 64) for block_k in (32, 64)
                for warps in (4, 8)] + capped + whole

    def fold_variant(self, launch, cfg: dict):
        return self._variant(launch, cfg, "_replay_fold_kernel")

    def _variant(self, launch, cfg: dict, kernel: str):
        """The captured launch of `kernel` with another launch config (grid recomputed), after the per-head terms."""
        if getattr(launch, "kernel", None) != kernel:
            raise RuntimeError(f"not a {kernel} launch: {getattr(launch, 'kernel', None)}")
        grid, _, kwargs = launch.launch
        new_grid = kda_triton.step_grid(grid[0], self.state_heads, self.V, cfg["BLOCK_V"])
        return lambda: launch.relaunch(new_grid, {**kwargs, **cfg})

    def conventional(self, batch: int, block: int):
        s = self.fp32_state(batch)
        q, k, v, g, beta = self.token(batch)
        return lambda: self.kernels.conventional_step(q, k, v, g, beta, s, block_v=block)

    def check_conventional(self, batch: int = 2) -> float:
        s = self.fp32_state(batch)
        q, k, v, g, beta = self.token(batch)
        o_ref, st = self.kernels.decode_reference(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                  from_format_layout(s).contiguous(), CONVENTIONAL)
        s_got = s.clone()
        o = self.kernels.conventional_step(q, k, v, g, beta, s_got)
        return max(relerr(o_ref[:, 0], o), relerr(st.hi, s_got))

    def chunked(self, inputs, config: str, backend: str):
        return self.kernels.chunked(*inputs, config, backend=backend)

    def public_steps(self, inputs, config: str, tokens: int):
        q, k, v, g, beta, s0 = inputs
        state = s0
        for t in range(tokens):
            sl = slice(t, t + 1)
            _, state = self.kernels.decode_step(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], state, config)


def step_variant(module, launch, cfg: dict, heads: int, rows: int, block: int):
    """The captured `_replay_step_kernel` launch of `module` with another launch config (grid recomputed).

    rows: the state rows a program's tiles split (Mamba-2 head_dim P, GDN V); block: rows per tile."""
    if getattr(launch, "kernel", None) != "_replay_step_kernel":
        raise RuntimeError(f"not a _replay_step_kernel launch: {getattr(launch, 'kernel', None)}")
    grid, _, kwargs = launch.launch
    new_grid = module.step_grid(grid[0], heads, rows, block, cfg["TILES"])
    return lambda: launch.relaunch(new_grid, {**kwargs, **cfg})


BENCHES = {bench.name: bench for bench in (Mamba2, GDN, KDA)}  # kernel family name -> its benchmark driver


def driver_geometry(name: str, tiny: bool) -> dict:
    """A family's benchmark sizes: its driver's tiny ones, or its full-size preset's (`models.presets.full_size_preset`)."""
    bench = BENCHES[name]
    return bench.tiny if tiny else bench.dims(PRESETS[full_size_preset(name)])


def read_copy_bytes(fam, batch: int, config: str) -> int:
    """Bytes of the read copy a non-flush step reads (format layout [B, H, P, N] / [B, HV, V, K])."""
    cfg = ReplayConfig.parse(config)
    fmt = cfg.recur_format if cfg.shared else cfg.read_format
    return fmt.storage_bytes(fam.stored_shape(batch))


# ---------------------------------------------------------------------------------------------- sections


def copy_bandwidth(res: Results, timer: Timer, device: str, tiny: bool) -> float | None:
    def run(row):
        n = (16 << 20 if tiny else 1 << 30) // F32
        src = torch.rand(n, device=device)
        dst = torch.empty_like(src)
        ms = timer.kernel_ms(lambda: dst.copy_(src))
        row.update(ms=ms, bytes=2 * n * F32, gbps=2 * n * F32 / ms / 1e6, pct_copy=100.0)
    row = res.add(dict(section="copy", name=f"torch copy_ {'16 MiB' if tiny else '1 GiB'}"), run)
    return row.get("gbps")


def _bw(row, ms, nbytes, copy_gbps, state_bytes):
    row.update(ms=ms, bytes=nbytes, state_bytes=state_bytes, gbps=nbytes / ms / 1e6)
    if copy_gbps:
        row["pct_copy"] = 100.0 * row["gbps"] / copy_gbps


def step_bytes(fam, batch: int, config: str, flush: bool) -> tuple[int, int]:
    """(bytes a ReplaySSM step of `config` must move, the state copies' share of them): a non-flush step reads the
    read copy and MID + 1 entries; the flush reads S_hi and WINDOW entries and writes the fold."""
    if flush:
        state = batch * 2 * fam.state_elems() * F32
        return state + batch * fam.token_bytes(WINDOW), state
    read = read_copy_bytes(fam, batch, config)
    return read + batch * fam.token_bytes(MID + 1), read


def decode_section(res: Results, timer: Timer, fam, batches, copy_gbps, sweeps: tuple[str, ...],
                   reads: tuple[str, ...] = tuple(SWEEP_READS)):
    S32 = fam.state_elems() * F32
    name = fam.name
    res.add(dict(section="check", family=name, name="conventional_step vs decode_reference(fp32)", batch=2),
            lambda row: row.update(check=fam.check_conventional()))
    blocks = (8, 16, 32) if sweeps else (16,)
    best = {"block": 16}

    def sweep_row(block):
        def run(row):
            ms = timer.kernel_ms(fam.conventional(batches[-1], block))
            _bw(row, ms, batches[-1] * (2 * S32 + fam.token_bytes(1)), copy_gbps, batches[-1] * 2 * S32)
        return run
    if len(blocks) > 1:
        for block in blocks:
            r = res.add(dict(section="tune", family=name, name=f"conventional block={block}", batch=batches[-1]),
                        sweep_row(block))
            if r.get("ms") is not None and r["ms"] < best.get("ms", math.inf):
                best.update(block=block, ms=r["ms"])
    block = best["block"]
    tuned = {}
    if sweeps and hasattr(fam, "step_variants"):
        tuned = step_sweep(res, timer, fam, batches[-1], copy_gbps, sweeps, reads)

    for batch in batches:
        st_bytes = batch * 2 * S32

        def conv(row, batch=batch):
            ms = timer.kernel_ms(fam.conventional(batch, block))
            _bw(row, ms, batch * (2 * S32 + fam.token_bytes(1)), copy_gbps, batch * 2 * S32)
        res.add(dict(section="decode", family=name, name="conventional", batch=batch, note=f"block={block}"), conv)

        s0 = fam.fp32_state(batch)

        def conv_replay(row, batch=batch):
            launch, _ = fam.step_launch(fam.replay_state(s0, CONVENTIONAL, 0), CONVENTIONAL)
            _bw(row, timer.kernel_ms(launch), batch * (2 * S32 + fam.token_bytes(1)), copy_gbps, st_bytes)
        res.add(dict(section="decode", family=name, name="conventional (replay@1)", batch=batch), conv_replay)

        for label, config in (("fp32", FP32_READ), ("nvfp4", NVFP4_READ)):
            def nonflush(row, batch=batch, config=config):
                _time_step(row, timer, fam, s0, config, "non-flush", tuned, batch, copy_gbps)
            res.add(dict(section="decode", family=name, name=f"non-flush {label} read", batch=batch, config=config,
                         note=f"{MID + 1} entries"), nonflush)

            def flush(row, batch=batch, config=config, label=label):
                out = _time_step(row, timer, fam, s0, config, "flush", tuned, batch, copy_gbps)
                if label == "nvfp4":  # the torch pass that rounds the fold to both copies and packs the read copy
                    pack = fam.packing(out[1].hi.contiguous(), config)  # the fold as rounded (fp32 recurrence: exact)
                    ms = timer.kernel_ms(pack)
                    res.add(dict(section="decode", family=name, name="flush packing (torch)", batch=batch,
                                 config=config, ms=ms, note="write_checkpoint_packed, host-side torch"))
            res.add(dict(section="decode", family=name, name=f"flush {label}", batch=batch, config=config,
                         note=f"{WINDOW} entries"), flush)
        del s0
        if timer.cuda:
            torch.cuda.empty_cache()

        derive_amortised(res, name, batch, copy_gbps)


def _time_step(row, timer: Timer, fam, s0, config: str, phase: str, tuned: dict, batch: int, copy_gbps):
    """Time the kernel launch of one decode token of `config` from the FP32 state s0 in `phase` ("non-flush": MID
    committed entries; "flush": WINDOW - 1) into row, with the launch config tuned for it where the sweep has one
    (`_replay_step_kernel` for a non-flush step, a family's `fold_kernel` for a flush); returns the step's
    outputs."""
    flush = phase == "flush"
    launch, out = fam.step_launch(fam.replay_state(s0, config, WINDOW - 1 if flush else MID), config)
    kernel = getattr(launch, "kernel", "")
    if flush and kernel == getattr(fam, "fold_kernel", None):
        launch, kernel = _tuned(fam, launch, tuned.get((phase, config)), batch, fam.fold_variant, fam.fold_keys)
    elif not flush and kernel == "_replay_step_kernel":
        launch, kernel = _tuned(fam, launch, tuned.get((phase, config)), batch, fam.step_variant, fam.step_keys)
    nbytes, state = step_bytes(fam, batch, config, flush)
    _bw(row, timer.kernel_ms(launch), nbytes, copy_gbps, state)
    if kernel:
        row["note"] = f"{row['note']}; {kernel}"
    return out


def launch_config(launch, keys) -> dict:
    """The values of `keys` a captured launch passed (a key the kernel defaults is left out)."""
    kwargs = launch.launch[2]
    return {k: kwargs[k] for k in keys if k in kwargs}


def _tuned(fam, launch, cfg: dict | None, batch: int, variant, keys) -> tuple:
    """(the launch with the config tuned at the largest batch where there is one and batch x heads >= 4096, and the
    row's note)."""
    kernel = launch.kernel
    if cfg is not None and batch * fam.state_heads >= 4096:
        launch, kernel = variant(launch, cfg), kernel + " tuned"
    else:
        cfg = launch_config(launch, keys)
    return launch, kernel + " " + " ".join(f"{k}={v}" for k, v in cfg.items())


def step_sweep(res: Results, timer: Timer, fam, batch: int, copy_gbps, sweeps: tuple[str, ...],
               reads: tuple[str, ...] = tuple(SWEEP_READS)) -> dict:
    """Tune rows: the step kernels over launch configs at `batch`, per read copy: the non-flush `_replay_step_kernel`
    (`step_variants`) and, where the family has `fold_variants`, the flush's `fold_kernel`. The default launch
    is timed first, so a sweep the budget cuts short never picks a slower one. Returns {(phase, config): best launch
    config} where it is not the default; the decode rows use it where batch x heads >= 4096. sweeps: the phases to
    sweep ("non-flush", "flush"); reads: the read copies (`SWEEP_READS`)."""
    best = {}
    s0 = fam.fp32_state(batch)
    phases = [("non-flush", MID, "_replay_step_kernel", fam.step_variants, fam.step_variant, fam.step_keys)]
    if hasattr(fam, "fold_variants"):
        phases.append(("flush", WINDOW - 1, fam.fold_kernel, fam.fold_variants, fam.fold_variant, fam.fold_keys))
    for phase, count, kernel, variants, variant, keys in (p for p in phases if p[0] in sweeps):
        for label in reads:
            config = SWEEP_READS[label]
            holder = {}

            def capture(row, config=config, count=count):
                holder["launch"], _ = fam.step_launch(fam.replay_state(s0, config, count), config)
                row["note"] = f"{holder['launch'].kernel} default: " + " ".join(
                    f"{k}={v}" for k, v in launch_config(holder["launch"], keys).items())
            r = res.add(dict(section="tune", family=fam.name, name=f"{phase} {label} read launch", batch=batch),
                        capture)
            if r.get("error") or holder["launch"].kernel != kernel:
                continue
            nbytes, state = step_bytes(fam, batch, config, phase == "flush")
            default = launch_config(holder["launch"], keys)
            found = None
            for cfg in _distinct([default] + variants(), default if label == "fp32" else {}):
                if res.left() < 30:
                    res.add(dict(section="tune", family=fam.name, name=f"{phase} {label} read sweep", batch=batch,
                                 error=f"skipped: {res.left():.0f} s left of the budget"))
                    break

                def run(row, cfg=cfg):
                    _bw(row, timer.kernel_ms(variant(holder["launch"], cfg)), nbytes, copy_gbps, state)
                name = f"{phase} {label} {_short(cfg)}{' (default)' if cfg == default else ''}"
                r = res.add(dict(section="tune", family=fam.name, batch=batch, name=name), run)
                if r.get("ms") is not None and (found is None or r["ms"] < found[1]):
                    found = (cfg, r["ms"])
            if found is not None and found[0] != default:
                best[(phase, config)] = found[0]
    del s0
    return best


def _distinct(configs: list[dict], fixed: dict) -> list[dict]:
    """`configs` in order without repeats, WORDS taken from `fixed` where it has one (the FP32 read ignores how NVFP4
    codes load: one launch per other keys, not one per WORDS)."""
    out = []
    for cfg in configs:
        cfg = {**cfg, "WORDS": fixed["WORDS"]} if "WORDS" in cfg and "WORDS" in fixed else cfg
        if cfg not in out:
            out.append(cfg)
    return out


_SHORT = {"BLOCK_P": "p", "BLOCK_V": "v", "BLOCK_K": "k", "TILES": "t", "WORDS": "words", "num_warps": "w",
          "maxnreg": "r", "STAGES": "s", "TERMS": "terms"}


def _short(cfg: dict) -> str:
    """A launch config as a row name: p16 t1 w4 (BLOCK_P, TILES, num_warps), v16 k128 t8 w4 r128 (BLOCK_V, BLOCK_K,
    ..., maxnreg where set; TERMS only where on)."""
    return " ".join(f"{_SHORT[k]}{int(v)}" for k, v in cfg.items() if v is not None and not (k == "TERMS" and not v))


def derive_amortised(res: Results, name: str, batch: int, copy_gbps):
    conv = res.find(section="decode", family=name, name="conventional", batch=batch)
    conv1 = res.find(section="decode", family=name, name="conventional (replay@1)", batch=batch)
    pack = res.find(section="decode", family=name, name="flush packing (torch)", batch=batch)
    for label in ("fp32", "nvfp4"):
        nf = res.find(section="decode", family=name, name=f"non-flush {label} read", batch=batch)
        fl = res.find(section="decode", family=name, name=f"flush {label}", batch=batch)
        row = dict(section="decode", family=name, name=f"amortised L=16 {label} read", batch=batch, derived=True)
        if nf is None or fl is None:
            row["error"] = "missing non-flush or flush row"
            res.add(row)
            continue
        ms = ((WINDOW - 1) * nf["ms"] + fl["ms"]) / WINDOW
        nbytes = ((WINDOW - 1) * nf["bytes"] + fl["bytes"]) / WINDOW
        state = ((WINDOW - 1) * nf["state_bytes"] + fl["state_bytes"]) / WINDOW
        _bw(row, ms, nbytes, copy_gbps, state)
        if conv is not None:
            row["speedup_vs_conventional"] = conv["ms"] / ms
        if conv1 is not None:
            row["speedup_vs_replay1"] = conv1["ms"] / ms
        row["note"] = (f"conv/this = {row.get('speedup_vs_conventional', float('nan')):.2f}x, "
                       f"replay@1/this = {row.get('speedup_vs_replay1', float('nan')):.2f}x")
        res.add(row)
        if label == "nvfp4" and pack is not None:
            ms_p = ms + pack["ms"] / WINDOW
            extra = dict(section="decode", family=name, name="amortised L=16 nvfp4 read + packing", batch=batch,
                         derived=True, ms=ms_p)
            if conv is not None:
                extra["speedup_vs_conventional"] = conv["ms"] / ms_p
                extra["note"] = f"conv/this = {extra['speedup_vs_conventional']:.2f}x"
            res.add(extra)
    nf32 = res.find(section="decode", family=name, name="non-flush fp32 read", batch=batch)
    nf4 = res.find(section="decode", family=name, name="non-flush nvfp4 read", batch=batch)
    if nf32 is not None and nf4 is not None:
        res.add(dict(section="decode", family=name, name="nvfp4-read speedup (non-flush)", batch=batch, derived=True,
                     speedup=nf32["ms"] / nf4["ms"], note=f"fp32/nvfp4 = {nf32['ms'] / nf4['ms']:.2f}x"))


def _free():
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def chunk_section(res: Results, timer: Timer, fam, config: str, backend: str, lengths, probe: int):
    """chunked(..., backend) at batch 1: a probe (compiles, predicts), then each length that fits the budget."""
    name = fam.name
    last = None  # (tokens, seconds) of the last measured call, to predict the next one
    if res.left() < 20:
        res.add(dict(section="chunked", family=name, name=f"chunked {backend}", config=config, backend=backend,
                     tokens=probe, error=f"skipped: {res.left():.0f} s left of the budget"))
        return

    def probe_run(row):
        nonlocal last
        inputs = fam.sequence(probe)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fam.chunked(inputs, config, backend)  # compiles
            secs = timer.wall_s(lambda: fam.chunked(inputs, config, backend))
        row.update(seconds=secs, tokens_per_s=probe / secs)
        fallback = [str(w.message) for w in caught if "torch" in str(w.message) and "backend" in str(w.message)]
        if fallback:
            row["note"] = "fallback: " + fallback[0][:160]
        elif backend == "triton":
            row["note"] = "triton (no torch fallback)"
        last = (probe, secs)
    res.add(dict(section="chunked", family=name, name=f"chunked {backend} (probe, compile)", config=config,
                 backend=backend, tokens=probe), probe_run)
    _free()
    for tokens in lengths:
        row = dict(section="chunked", family=name, name=f"chunked {backend}", config=config, backend=backend,
                   tokens=tokens)
        if last is None:
            row["error"] = "skipped: the probe failed"
            res.add(row)
            return
        predicted = last[1] * tokens / last[0] * 1.5 + 2.0  # + input generation and allocation
        if predicted > res.left():
            row["error"] = f"skipped: predicted {predicted:.0f} s > {res.left():.0f} s left of the budget"
            res.add(row)
            return

        def run(row, tokens=tokens):
            nonlocal last
            inputs = fam.sequence(tokens)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                secs = [timer.wall_s(lambda: fam.chunked(inputs, config, backend))]
                if secs[0] * 3 < min(5.0, res.left() / 4):  # repeat short calls, take the median
                    secs += [timer.wall_s(lambda: fam.chunked(inputs, config, backend)) for _ in range(2)]
            median = sorted(secs)[len(secs) // 2]
            row.update(seconds=median, tokens_per_s=tokens / median, repeats=len(secs))
            last = (tokens, median)
        res.add(row, run)
        _free()


def step_section(res: Results, timer: Timer, fam, step_tokens: int, public_tokens: int):
    """Step-by-step decoding through the decode kernels of CHUNK_TRITON at batch 1, launches prepared once."""
    name = fam.name
    launches = []

    def build(row):
        s0 = fam.fp32_state(1)
        for count in range(WINDOW):  # one prepared launch per window position; the 16th folds
            launch, _ = fam.step_launch(fam.replay_state(s0, CHUNK_TRITON, count), CHUNK_TRITON)
            launches.append(launch)
        timer.sync()
        secs = timer.wall_s(lambda: [launches[t % WINDOW]() for t in range(step_tokens)])
        row.update(seconds=secs, tokens_per_s=step_tokens / secs)
    res.add(dict(section="step", family=name, name="step-by-step kernels (eager launches)", config=CHUNK_TRITON,
                 tokens=step_tokens, note="host launch overhead included"), build)

    def graph(row):
        if not timer.cuda or not launches:
            raise RuntimeError("CUDA graphs need a GPU" if not timer.cuda else "no launches prepared")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for launch in launches:
                launch()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for t in range(step_tokens):
                launches[t % WINDOW]()
        g.replay()
        secs = sorted(timer.wall_s(g.replay) for _ in range(5))[2]
        row.update(seconds=secs, tokens_per_s=step_tokens / secs)
    res.add(dict(section="step", family=name, name="step-by-step kernels (CUDA graph)", config=CHUNK_TRITON,
                 tokens=step_tokens), graph)

    def public(row):
        if res.left() < 10:
            raise RuntimeError(f"skipped: {res.left():.0f} s left of the budget")
        inputs = fam.sequence(public_tokens)
        fam.public_steps(inputs, CHUNK_TRITON, 2)  # warm
        secs = timer.wall_s(lambda: fam.public_steps(inputs, CHUNK_TRITON, public_tokens))
        row.update(seconds=secs, tokens_per_s=public_tokens / secs)
    res.add(dict(section="step", family=name, name="step-by-step public decode_step_triton", config=CHUNK_TRITON,
                 tokens=public_tokens, note="host planning and packing included"), public)
    _free()


# ---------------------------------------------------------------------------------------------- report


def goals(res: Results, families, batches) -> list[dict]:
    out = []
    big = batches[-1]

    def add(family, what, goal, value, why="", at_most=False):
        met = None if value is None else (value <= goal if at_most else value >= goal)
        out.append(dict(family=family, what=what, goal=goal, value=value, at_most=at_most,
                        status="n/a" if met is None else ("met" if met else "MISSED"), note=why))

    for fam in families:
        conv = res.find(section="decode", family=fam, name="conventional", batch=big)
        am = res.find(section="decode", family=fam, name="amortised L=16 fp32 read", batch=big)
        am4 = res.find(section="decode", family=fam, name="amortised L=16 nvfp4 read", batch=big)
        add(fam, f"ReplaySSM (fp32 read, L=16) vs conventional, batch {big}", GOALS["replay_vs_conv"],
            am and am.get("speedup_vs_conventional"))
        add(fam, f"ReplaySSM (nvfp4 read, L=16) vs conventional, batch {big} (info)", GOALS["replay_vs_conv"],
            am4 and am4.get("speedup_vs_conventional"))
        add(fam, f"conventional kernel bandwidth / copy, batch {big}", GOALS["conv_bw"],
            conv and conv.get("pct_copy") and conv["pct_copy"] / 100)
        sp = res.find(section="decode", family=fam, name="nvfp4-read speedup (non-flush)", batch=big)
        add(fam, f"nvfp4-read non-flush vs fp32 read, batch {big}", GOALS["nvfp4_vs_fp32"], sp and sp.get("speedup"))
        for read in ("fp32", "nvfp4"):
            flush = res.find(section="decode", family=fam, name=f"flush {read}", batch=big)
            add(fam, f"flush ({read} read) / conventional step, batch {big}", GOALS["flush_vs_conv"],
                flush["ms"] / conv["ms"] if flush and conv else None, at_most=True)
        chunk = [r for r in res.rows if r.get("section") == "chunked" and r.get("family") == fam
                 and r.get("backend") == "triton" and not r.get("error") and "probe" not in r["name"]]
        steps = [r for r in res.rows if r.get("section") == "step" and r.get("family") == fam and not r.get("error")
                 and "kernels" in r["name"]]
        value, why = None, ""
        if chunk and steps:
            longest = max(chunk, key=lambda r: r["tokens"])
            fastest = max(steps, key=lambda r: r["tokens_per_s"])
            value = longest["tokens_per_s"] / fastest["tokens_per_s"]
            why = f"chunked T={longest['tokens']} vs {fastest['name']}"
        add(fam, "chunked (triton) vs step-by-step decoding, batch 1", GOALS["chunk_vs_step"], value, why)
    return out


def print_tables(res: Results, goal_rows, copy_gbps):
    log("\n=== copy bandwidth ===")
    log(f"{copy_gbps:.1f} GB/s (read + write)" if copy_gbps else "copy: ERROR")
    log("\n=== decode step (kernel time, median; GB/s over the bytes the step must move) ===")
    hdr = f"{'family':7} {'row':40} {'batch':>5} {'ms':>10} {'MB':>9} {'GB/s':>8} {'%copy':>6}  note"
    log(hdr)
    for r in res.rows:
        if r.get("section") not in ("decode", "tune", "check"):
            continue
        if r.get("error"):
            log(f"{r.get('family', ''):7} {r['name'][:40]:40} {r.get('batch', ''):>5}  ERROR {r['error']}")
            continue
        ms = f"{r['ms']:.4f}" if r.get("ms") is not None else ""
        mb = f"{r['bytes'] / 1e6:.1f}" if r.get("bytes") is not None else ""
        gb = f"{r['gbps']:.0f}" if r.get("gbps") is not None else ""
        pc = f"{r['pct_copy']:.0f}" if r.get("pct_copy") is not None else ""
        note = r.get("note") or ""
        if r.get("check") is not None:
            note = f"max rel err {r['check']:.2e} ({'ok' if r['check'] < 1e-5 else 'FAIL'})"
        log(f"{r.get('family', ''):7} {r['name'][:40]:40} {r.get('batch', ''):>5} {ms:>10} {mb:>9} {gb:>8} {pc:>6}  {note}")
    log("\n=== teacher-forced chunked vs step-by-step (batch 1, tokens/s per layer) ===")
    log(f"{'family':7} {'row':44} {'config':28} {'tokens':>7} {'seconds':>9} {'tokens/s':>12}  note")
    for r in res.rows:
        if r.get("section") not in ("chunked", "step"):
            continue
        if r.get("error"):
            log(f"{r['family']:7} {r['name'][:44]:44} {r.get('config', '')[:28]:28} {r.get('tokens', ''):>7}  ERROR {r['error']}")
            continue
        log(f"{r['family']:7} {r['name'][:44]:44} {r.get('config', '')[:28]:28} {r['tokens']:>7} {r['seconds']:>9.4f} "
            f"{r['tokens_per_s']:>12.4g}  {r.get('note') or ''}")
    log("\n=== goals ===")
    for g in goal_rows:
        value = "—" if g["value"] is None else (f"{g['value']:.0%}" if g["goal"] < 1 else f"{g['value']:.2f}x")
        goal = ("<= " if g["at_most"] else ">= ") + (f"{g['goal']:.0%}" if g["goal"] < 1 else f"{g['goal']}x")
        log(f"{g['family']:7} {g['what'][:62]:62} {goal:>8} {value:>8}  {g['status']}  {g['note']}")


def environment(device: str) -> dict:
    info = dict(command=" ".join([sys.executable.split("/")[-1]] + sys.argv), date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                torch=torch.__version__, triton=triton.__version__, python=platform.python_version(), device=device,
                triton_interpret=os.environ.get("TRITON_INTERPRET"))
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
    with contextlib.suppress(Exception):
        info["git"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                     timeout=10).stdout.strip()
        info["git_dirty"] = bool(subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                                                text=True, timeout=10).stdout.strip())
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--families", default="mamba2,gdn", help="comma-separated: mamba2, gdn, kda")
    ap.add_argument("--batches", help="comma-separated decode batches (default 1,32,128,256)")
    ap.add_argument("--lengths", help="comma-separated chunked lengths (default 16384,32768,131072)")
    ap.add_argument("--quick", action="store_true", help="smoke run: batches 1,256, lengths 4096, no block sweep")
    ap.add_argument("--tiny", action="store_true", help="tiny geometries and sizes (for TRITON_INTERPRET=1 on CPU)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget", type=float, default=240.0,
                    help="seconds from the start after which optional long runs (chunked lengths) are skipped")
    ap.add_argument("--skip-chunked", action="store_true", help="decode tables only")
    ap.add_argument("--sweeps", default=",".join(SWEEPS),
                    help="comma-separated step phases whose launches to sweep: non-flush, flush (--quick: none)")
    ap.add_argument("--sweep-reads", default=",".join(SWEEP_READS),
                    help="comma-separated read copies whose launches the sweeps time: fp32, nvfp4")
    args = ap.parse_args(argv)
    sweeps = tuple(p.strip() for p in args.sweeps.split(",") if p.strip())
    if unknown := [p for p in sweeps if p not in SWEEPS]:
        ap.error(f"unknown sweep {unknown[0]!r}; known: {', '.join(SWEEPS)}")
    reads = tuple(r.strip() for r in args.sweep_reads.split(",") if r.strip())
    if unknown := [r for r in reads if r not in SWEEP_READS]:
        ap.error(f"unknown read copy {unknown[0]!r} in --sweep-reads; known: {', '.join(SWEEP_READS)}")

    families = [f.strip() for f in args.families.split(",") if f.strip()]
    for f in families:
        if f not in family_names():
            ap.error(f"unknown family {f!r}; known: {', '.join(family_names())}")
        if f not in BENCHES:
            ap.error(f"no benchmark driver for the {f} family; drivers: {', '.join(BENCHES)}")
    if args.tiny:
        batches, lengths, torch_lengths, probe, step_tokens, public_tokens = [1, 2], [64, 128], [64], 32, 32, 4
    elif args.quick:
        batches, lengths, torch_lengths, probe, step_tokens, public_tokens = [1, 256], [4096], [4096], 2048, 128, 16
    else:
        batches, lengths, torch_lengths = [1, 32, 128, 256], [16384, 32768, 131072], [16384, 32768]
        probe, step_tokens, public_tokens = 2048, 512, 64
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
    if args.lengths:
        lengths = [int(n) for n in args.lengths.split(",")]

    env = environment(args.device)
    log(f"benchmarks/kernel_speed.py on {env.get('gpu', args.device)}; torch {env['torch']}, triton {env['triton']}; "
        f"families {families}, batches {batches}, lengths {lengths}, budget {args.budget:.0f} s")
    torch.backends.cuda.matmul.allow_tf32 = False
    res = Results(args.budget)
    timer = Timer(args.device, args.quick or args.tiny)
    copy_gbps = copy_bandwidth(res, timer, args.device, args.tiny)
    rand = Rand(args.device)
    geometry = {name: driver_geometry(name, args.tiny) for name in families}
    fams = {name: BENCHES[name](geometry[name], rand) for name in families}

    for name, fam in fams.items():
        log(f"--- decode step: {name} ---")
        decode_section(res, timer, fam, batches, copy_gbps, () if args.quick else sweeps, reads)
        _free()
    if not args.skip_chunked:
        for name, fam in fams.items():
            log(f"--- chunked (triton) and step-by-step: {name} ---")
            chunk_section(res, timer, fam, CHUNK_TRITON, "triton", lengths, probe)
            step_section(res, timer, fam, step_tokens, public_tokens)
        for name, fam in fams.items():
            log(f"--- chunked (torch backend): {name} ---")
            chunk_section(res, timer, fam, CHUNK_TORCH, "torch", torch_lengths, probe)

    goal_rows = goals(res, families, batches)
    print_tables(res, goal_rows, copy_gbps)
    errors = sum(1 for r in res.rows if r.get("error") and not str(r["error"]).startswith("skipped"))
    log(f"\n{len(res.rows)} rows, {errors} errors, {res.elapsed():.0f} s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(dict(environment=env, copy_gbps=copy_gbps, geometry=geometry, batches=batches, goals=goal_rows,
            rows=res.rows), indent=1, default=str))
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()

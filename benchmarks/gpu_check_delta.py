"""GPU check of the delta-rule Triton kernels (GDN, KDA) against the torch reference: max errors and pass/fail.

    python benchmarks/gpu_check_delta.py --family gdn --out out/gpu_check_gdn.json            # on a CUDA machine
    python benchmarks/gpu_check_delta.py --family kda --quick --out out/gpu_check_kda.json    # small shapes only

Every kernel of the family (chunked state passing with in-loop rounding, decode step reading the
packed read copy, speculative verification) runs on CUDA and is compared with the torch path on
the same inputs, for several configs including a full-size geometry (GDN: Qwen3.5-4B, HV=32,
H=16, K=V=128; KDA: Kimi-Linear-48B-A3B, H = HV = 32, K = V = 128). For KDA the FP32 chunked
Triton form is also compared with transformers' `chunk_kimi_delta_attention` (`hf` rows; skipped
when the installed transformers has no kimi_linear). Errors are relative to max |reference|.
FP32 formats must agree to 1e-4 over the whole input.

Quantized formats. The kernel and torch compute each fold in FP32 in different orders (~1e-7
apart), so a few rounding decisions of a stored copy flip (an SR threshold or RNE midpoint lies
between the two values): one FP16 / E4M3 step in hi, one E2M1 step (or a block scale) in lo.
A flip in the checkpoint then changes every later output that reads it and, through u and the
fold, later checkpoints: the two runs become two draws of the format's own noise. Free-running
errors are therefore not a criterion (reported as err_o / state, not judged): perturbing only
the torch path's pre-round folds by ~1 ulp of random noise reproduces the H200 numbers (torch vs
perturbed torch, seqlen 257: qwen3.5-4b nvfp4:scale=row/fp16sr 7.3e-2 / state 0.9981,
nvfp4:scale=head/fp8sr#closed 4.4e-2 / 0.9996; small nvfp4:scale=row/fp16sr 8.18e-2 in 5 of 6
noise seeds; a 20-step decode 4.5e-3..6.9e-3 from one flipped NVFP4 element). Instead:

- chunked, lockstep: every window of L tokens (one checkpoint) starts both backends from the
  torch path's stored copies. Per window: outputs agree to 1e-4 (max `win_o`); the pre-round
  folds (kernel: `chunked_triton(rounded=False)`, same tiling; torch: the FP32-format config)
  agree to 1e-5 (`fold`; with a buffer dtype, one step of it: `fold_tolerance`); the kernel's stored copies equal `write_checkpoint` of its own
  pre-round fold except for at most 1e-4 of the elements (`unexpl`, 0 where the two launches
  fold bit-identically; a rotated recurrence copy's kernel variant sums its fold in another FP32 order than the
  rounded=False launch on a GPU, so its own fold is the FP32 read copy of a launch of the same recurrence copy,
  `own_fold`); and at most 1e-2 of the stored elements differ from torch's (`flips`,
  worst copy and checkpoint), all of them explained by the fold difference.
- decode_step: outputs agree to 1e-4 up to the first checkpoint whose stored copies differ
  from the reference's (`compared` tokens), and that checkpoint flips at most 1e-2 of them.
An element counts as flipped where |diff| > 1e-6 (|element| + max |copy|).
tests/kernels/test_gdn_triton.py runs the same lockstep check in the interpreter at K = V = 128.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import time
from pathlib import Path

import torch

from replayssm_eval.kernels.delta.reference import verify_drafts
from replayssm_eval.kernels.delta.triton_step import read_copy_format
from replayssm_eval.kernels.family import FAMILY_PACKAGES, family_names, get_family
from replayssm_eval.models.presets import PRESETS, full_size_preset
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.state import write_checkpoint

FLIP_BUDGET = 1e-2  # fraction of a stored copy's elements a checkpoint may flip
UNEXPLAINED_BUDGET = 1e-4  # fraction differing from write_checkpoint of the kernel's own pre-round fold
FLIP_SIZE = 0.5  # the most a flipped element may differ, relative to the copy's max |element| (one grid step)

DELTA_FAMILIES = [name for name in family_names() if get_family(name).closed_fold]  # the closed fold is the delta rule's
SMALL = dict(batch=3, heads=2, value_heads=4, dk=20, dv=24)
COMMON_CONFIGS = [
    "fp32/fp32@16", "fp32/fp32@16#closed", "nvfp4:scale=row/fp16sr@16", "nvfp4:scale=head/fp8sr@16#closed",
    "shared:nvfp4:scale=head@16", "fp16/fp32@16", "fp32/fp32@8#spec=3:0.7#closed", "int8/fp16sr@16",
    "int16:scale=head/int8sr@16#closed", "shared:int16sr@16", "flashinfer:int16", "vllm:replay-fp16sr",
    "fp16sr:words=octet,cvt=soft/fp16sr:words=pair@16", "int8sr:scale=block:32/fp16sr@16", "sglang:fp8",
    "mxfp8/int8:scale=block:64@16#closed",
    # blocks along V rotated along V (as modelopt:int8-hadamard, whose runs of 32 need V a multiple of 32), and a
    # rotation along K: rounded in the kernel
    "int8:axis=headdim,scale=block:8,rot=hadamard:8/fp8sr:rot=hadamard:4@16",
]
EXTRA_CONFIGS = {"gdn": ["nvfp4:scale=tensor/fp32@16"], "kda": ["nvfp4/fp32@16"]}  # beside COMMON_CONFIGS


def inputs(family, batch, heads, value_heads, dk, dv, seqlen, device, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q = torch.nn.functional.normalize(rand(batch, seqlen, heads, dk), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(rand(batch, seqlen, heads, dk), dim=-1)
    v = rand(batch, seqlen, value_heads, dv)
    rate = torch.linspace(0.001, 0.3, value_heads)
    if get_family(family).shapes["g"].startswith("[B, T, HV, K]"):  # per-channel log decay (KDA)
        rate = rate[:, None] * (0.5 + 0.5 * torch.rand(value_heads, dk, generator=gen))
        g = -rate * torch.rand(batch, seqlen, value_heads, dk, generator=gen) * 2
    else:
        g = -rate * torch.rand(batch, seqlen, value_heads, generator=gen) * 2
    beta = torch.rand(batch, seqlen, value_heads, generator=gen)
    s0 = rand(batch, value_heads, dk, dv) * 0.3
    return [t.to(device) for t in (q, k, v, g, beta, s0)]


def rel(ref, got):
    return ((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp(min=1e-30)).item()


def agree(ref, got):
    return ((got - ref).abs() <= 1e-5 * ref.abs().max()).float().mean().item()


def flipped(ref, got):
    """Elements of a stored copy that differ beyond FP32 noise: 1e-6 of the element (a global scale one ulp apart
    moves a whole row by ~1 ulp) plus 1e-6 of the copy's max (FP32 copies: cancellation in small elements).
    A flip is one rounding step: an element off by more than FLIP_SIZE * max|ref| counts as every element flipped."""
    err = (got - ref).abs()
    if err.max() > FLIP_SIZE * ref.abs().max():
        return torch.ones_like(err, dtype=torch.bool)
    return err > 1e-6 * (ref.abs() + ref.abs().max())


def fold_tolerance(config: ReplayConfig) -> float:
    """How far the two backends' pre-round folds may differ (relative): FP32 summation orders, or, with buffered u's
    rounded to a buffer dtype (`#buf=`), one step of that dtype in a u that FP32 order moved across a rounding point."""
    if config.buffer_dtype == "fp32":
        return 1e-5
    return torch.finfo({"bf16": torch.bfloat16, "fp16": torch.float16}[config.buffer_dtype]).eps


def own_fold(mod, x, state, config, unrounded):
    """The FP32 fold the config's launch rounded: `unrounded` (the rounded=False launch's), or, where the recurrence
    copy is rotated (its kernel variant sums the fold in another FP32 order on a GPU; the rotated read copy leaves it
    as it is), the FP32 read copy of a launch of the same recurrence copy beside it (BENCHMARKS.md, Correctness on the
    GPU)."""
    codec = config.recur_format.kernel_codec
    if codec is None or codec.rot == 1:
        return unrounded
    beside = dataclasses.replace(config, read="fp32", shared=False)
    _, folded = mod.RULE.chunk.chunked_triton(mod.RULE.prepare(*x, state, beside))
    return folded.lo


def lockstep(mod, cfg, data):
    """Quantized chunked, window by window from identical stored copies (see the module docstring)."""
    config = ReplayConfig.parse(cfg)
    c32 = dataclasses.replace(config, read="fp32", recur="fp32")
    window, seqlen = config.window, data[0].shape[1]
    prep = lambda x, st: mod.RULE.prepare(*x, st, config)  # noqa: E731
    state = prep([t[:, :1] for t in data[:5]], data[5]).state  # checkpoint 0 as a ReplayState
    worst = dict(win_o=0.0, fold=0.0, unexpl=0.0, flips=0.0)
    for w in range(0, seqlen, window):
        x = [t[:, w:w + window] for t in data[:5]]
        o_t, st_t = mod.chunked(*x, state, config)
        o_k, st_k = mod.chunked(*x, state, config, backend="triton")
        worst["win_o"] = max(worst["win_o"], rel(o_t, o_k))
        rows = (st_t.checkpoint != state.checkpoint).nonzero().flatten()
        if rows.numel():
            _, f_t = mod.chunked(*x, state, c32)
            _, f_k = mod.RULE.chunk.chunked_triton(prep(x, state), rounded=False)
            worst["fold"] = max(worst["fold"], rel(f_t.hi[rows], f_k.hi[rows]))
            own = own_fold(mod, x, state, config, f_k.hi)
            hk, lk = write_checkpoint(own[rows], config, 0, st_k.seq_ids[rows], st_k.checkpoint[rows])
            for mine, got, ref in ((hk, st_k.hi[rows], st_t.hi[rows]), (lk, st_k.lo[rows], st_t.lo[rows])):
                worst["unexpl"] = max(worst["unexpl"], flipped(mine, got).float().mean().item())
                worst["flips"] = max(worst["flips"], flipped(ref, got).float().mean().item())
        state = st_t
    ok = (worst["win_o"] <= 1e-4 and worst["fold"] <= fold_tolerance(config) and worst["unexpl"] <= UNEXPLAINED_BUDGET
          and worst["flips"] <= FLIP_BUDGET)
    return worst, ok


def check_chunked(mod, cfg, data):
    quantized = not ReplayConfig.parse(cfg).is_reference
    o_ref, st_ref = mod.chunked(*data, cfg)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    o, st = mod.chunked(*data, cfg, backend="triton")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    err_o, state_ok = rel(o_ref, o), agree(st_ref.hi, st.hi)
    if not quantized:
        return dict(kernel="chunked", err_o=err_o, state_agree=state_ok, seconds=seconds,
                    ok=err_o <= 1e-4 and rel(st_ref.hi, st.hi) <= 1e-4)
    worst, ok = lockstep(mod, cfg, data)
    return dict(kernel="chunked", err_o=err_o, state_agree=state_ok, seconds=seconds, ok=ok, **worst)


def check_step(mod, cfg, data, steps):
    quantized = not ReplayConfig.parse(cfg).is_reference
    cut = lambda a, b: [t[:, a:b] for t in data[:5]]  # noqa: E731
    ref, state, outs, refs = data[5], data[5], [], []
    compared, flips = steps, 0.0
    for n in range(steps):
        o_r, ref = mod.decode_reference(*cut(n, n + 1), ref, cfg)
        o, state = mod.decode_step_triton(*cut(n, n + 1), state, cfg)
        outs.append(o)
        refs.append(o_r)
        if compared == steps:
            diff = max(flipped(ref.hi, state.hi).float().mean().item(), flipped(ref.lo, state.lo).float().mean().item())
            if diff > 0:  # stored copies diverged at this step's checkpoint: later outputs read different states
                compared, flips = n + 1, diff
    o_ref, o = torch.cat(refs, 1), torch.cat(outs, 1)
    err_o, state_ok = rel(o_ref, o), agree(ref.hi, state.hi)
    if not quantized:
        return dict(kernel="decode_step", err_o=err_o, state_agree=state_ok, seconds=None, ok=err_o <= 1e-4 and state_ok >= 0.98)
    err_pre = rel(o_ref[:, :compared], o[:, :compared])
    return dict(kernel="decode_step", err_o=err_o, state_agree=state_ok, seconds=None, win_o=err_pre,
                compared=compared, flips=flips, ok=err_pre <= 1e-4 and flips <= FLIP_BUDGET)


def check_verify(mod, cfg, data, drafts=4):
    config = ReplayConfig.parse(cfg)
    cut = lambda a, b: [t[:, a:b] for t in data[:5]]  # noqa: E731
    state = data[5]
    for n in range(5):
        _, state = mod.decode_step_triton(*cut(n, n + 1), state, config)
    new = dict(zip(("q", "k", "v", "g", "beta"), cut(5, 5 + drafts)))
    bsz = data[0].shape[0]
    width = torch.full((bsz,), drafts, device=data[0].device)
    read_hi = torch.arange(bsz, device=data[0].device) % 2 == 1
    groups = data[2].shape[2] // data[0].shape[2]
    u, o = mod.RULE.step.verify_triton(state.hi, state.lo_packed, read_copy_format(config), state.buffer,
                                          state.schedule.count, new, width, read_hi, groups)
    err = 0.0
    for b in range(bsz):
        ring = {name: t[b].clone() for name, t in state.buffer.items()}
        h = int(state.schedule.count[b])
        ring["k"][h:h + drafts] = new["k"][b]
        ring["g"][h:h + drafts] = new["g"][b]
        src = (state.hi if read_hi[b] else state.lo)[b].transpose(-1, -2)
        q = new["q"][b].repeat_interleave(groups, 1)
        _, o_ref = verify_drafts(src, ring, h, drafts, q, new["v"][b], new["beta"][b], groups, config.skip_read_below)
        err = max(err, rel(o_ref, o[b]))
    return dict(kernel="verify", err_o=err, state_agree=None, seconds=None, ok=err <= 1e-4)


def geometries(family: str) -> dict[str, dict]:
    """{name: sizes}: the small shape and the family's full-size preset (`models.presets.full_size_preset`)."""
    name = full_size_preset(family)
    geo = PRESETS[name]
    return {"small": SMALL, name: dict(batch=4, heads=geo.n_groups, value_heads=geo.num_heads, dk=geo.state_dim,
                                       dv=geo.head_dim)}


def check_hf(data):
    """KDA: FP32 chunked Triton == transformers' chunk_kimi_delta_attention on the raw q, k it normalises and scales
    (HF has no head grouping: H = HV geometries only). The call ends on a checkpoint, so S_hi is the final state."""
    try:
        from transformers.models.kimi_linear import modeling_kimi_linear as hf
    except ImportError:
        return None
    window = 16
    seqlen = data[0].shape[1] // window * window
    x = [t[:, :seqlen] for t in data[:5]]
    chunk = getattr(hf.chunk_kimi_delta_attention, "__wrapped__", hf.chunk_kimi_delta_attention)
    o_hf, s_hf = chunk(*x, initial_state=data[5], output_final_state=True, use_qk_l2norm_in_kernel=True)
    q, k = hf.l2norm(x[0]) * x[0].shape[-1] ** -0.5, hf.l2norm(x[1])
    o, st = get_family("kda").chunked(q, k, *x[2:], data[5], f"fp32/fp32@{window}", backend="triton")
    err_o, err_s = rel(o_hf, o), rel(s_hf, st.hi.transpose(-1, -2))
    return dict(kernel="hf", err_o=err_o, state_agree=None, seconds=None, err_state=err_s,
                ok=err_o <= 1e-4 and err_s <= 1e-4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=DELTA_FAMILIES, required=True, help="the delta-rule family to check")
    parser.add_argument("--quick", action="store_true", help="small geometry only")
    parser.add_argument("--seqlen", type=int, default=257)
    parser.add_argument("--out", help="JSON result file (its folder is created); default gpu_check_FAMILY.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check_delta.py needs a CUDA device")
    mod, out = importlib.import_module(FAMILY_PACKAGES[args.family]), args.out or f"gpu_check_{args.family}.json"
    rows = []
    for geo, shape in geometries(args.family).items():
        if args.quick and geo != "small":
            continue
        data = inputs(args.family, **shape, seqlen=args.seqlen, device="cuda")
        hf_row = check_hf(data) if args.family == "kda" and shape["heads"] == shape["value_heads"] else None
        if hf_row is not None:
            rows.append(dict(geometry=geo, config="fp32 vs HF", **hf_row))
            print(f"{geo:15s} {'fp32 vs HF chunk_kimi_delta_attention':36s} err_o {hf_row['err_o']:.2e}  "
                  f"state {hf_row['err_state']:.2e}  {'PASS' if hf_row['ok'] else 'FAIL'}", flush=True)
        for cfg in COMMON_CONFIGS + EXTRA_CONFIGS.get(args.family, []):
            results = [check_chunked(mod, cfg, data), check_step(mod, cfg, data, steps=20)]
            if "spec" in cfg:
                results.append(check_verify(mod, cfg, data))
            for r in results:
                rows.append(dict(geometry=geo, config=cfg, **r))
                r_fmt = "-" if r["state_agree"] is None else f"{r['state_agree']:.4f}"
                t_fmt = "-" if r["seconds"] is None else f"{r['seconds']:.3f}"
                extra = "  ".join(f"{k} {r[k]:.2e}" if isinstance(r[k], float) else f"{k} {r[k]}"
                                  for k in ("win_o", "fold", "unexpl", "flips", "compared") if k in r)
                print(f"{geo:15s} {cfg:36s} {r['kernel']:12s} err_o {r['err_o']:.2e}  state {r_fmt:7s} "
                      f"time {t_fmt:7s} {extra}  {'PASS' if r['ok'] else 'FAIL'}", flush=True)
    failed = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(failed)} / {len(rows)} passed")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), family=args.family, seqlen=args.seqlen, rows=rows), fh, indent=1)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()

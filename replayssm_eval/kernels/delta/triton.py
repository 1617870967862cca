"""Triton pieces shared by the delta-rule families (gdn: scalar decay, kda: per-channel decay).

The families keep their own kernels where the math differs (a scalar decay per head is cheaper than a
per-channel one); what is the same for both lives here: the state layout [B, HV, V, K] and the formats
are the same, so are

- the jit helpers `_dot` (FP32 product), `_store_round` (in-kernel rounding of a stored copy, Philox
  bits `tl.randint(key, (checkpoint << 32) + element)` as `replay.keys`), `_decode_codes` and
  `_load_packed` (the packed read copy's tile);
- the host side of the chunked kernels: which copies round in-kernel (`_store_mode`), the launch
  configuration, and the loop over segment blocks with the torch rounding between one-segment
  launches of a copy no program can round (`run_segments`);
- the single-token step and verification in the `KernelFamily` call convention (`decode_step`,
  `verify`), around each family's launcher, and the read-copy arguments of the step kernels
  (`_read_args`), and `_forward_substitution`, the chunked kernels' delta rule with rounded buffered u's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.replay.buffer_round import buffer_kind, round_buffered
from replayssm_eval.kernels.delta._common import Prepared, to_format_layout
from replayssm_eval.kernels.delta.chunked import _BLOCK_ELEMENTS, Segments, state_after
from replayssm_eval.replay.keys import READ_COPY, RECUR_COPY, sr_keys
from replayssm_eval.replay.state import ReplayState, round_folded, write_checkpoint_packed
from replayssm_eval.quant.formats import FP8Format, NVFP4Format, ElementwiseFormat
from replayssm_eval.quant.triton import (
    FP8SR, FP16SR, KINDS, _e4m3_fast, _e5m2_fast, e2m1_decode, e4m3_decode, quantize_tile, tile_amax, triton_rounds,
)

# scale groups of the in-kernel store (format kinds are `quant.triton.KINDS`); globals read in @triton.jit are constexpr
_NONE, _ROW, _HEAD = map(tl.constexpr, range(3))
_SCALES = {"none": _NONE, "row": _ROW, "head": _HEAD}
_MAX_HEAD_V = 128  # largest V one program holds whole (needed by head scales)
_IDENTITY = (KINDS["fp32"].value, _NONE.value, 1.0)  # the store keeps the FP32 fold


@triton.jit
def _dot(a, b, DOT: tl.constexpr):
    """FP32 product: DOT = "ieee" (FMAs) or "tf32x3" (three TF32 tensor-core products, FP32-level error)."""
    return tl.dot(a, b, input_precision=DOT)


@triton.jit
def _store_round(x, key, checkpoint, elem, KIND: tl.constexpr, SCALE: tl.constexpr, FMT_MAX: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr):
    """One stored copy of the state tile x [BK, BV] (rows k, columns v; padding zero), as `fmt.quantize`.

    A format row is one v column (amax over K); a head is the whole tile. elem: [BK, BV] int64
    element index in the [HV, V, K] layout; SR bits = randint(key, (checkpoint << 32) + elem).
    """
    bits = tl.zeros((BK, BV), dtype=tl.int64)
    if (KIND == FP16SR) or (KIND == FP8SR):
        bits = tl.randint(key, (checkpoint << 32) + elem).to(tl.int64)
    xt = tl.trans(x)  # [BV, BK]: format rows are v columns, blocks run along K
    y = quantize_tile(xt, tl.trans(bits), tile_amax(xt, SCALE == _HEAD), KIND, SCALE != _NONE, FMT_MAX, 16, BV, BK)
    return tl.trans(y)


@triton.jit
def _forward_substitution(a, r, ts, BUF: tl.constexpr, LP: tl.constexpr):
    """u_t = r_t - sum_{i<t} a[t, i] round(u_i) row by row (a [LP, LP] strictly lower, r [LP, BV]): the delta rule of
    a segment whose buffered u's are rounded to the buffer dtype. Returns (u, round(u))."""
    u = tl.zeros_like(r)
    u_buf = tl.zeros_like(r)
    for t in range(LP):
        at_t = ts[:, None] == t
        a_t = tl.sum(tl.where(at_t, a, 0.0), axis=0)  # [LP] row t of a
        u_t = tl.sum(tl.where(at_t, r, 0.0), axis=0) - tl.sum(a_t[:, None] * u_buf, axis=0)  # [BV]
        u = tl.where(at_t, u_t[None, :], u)
        u_buf = tl.where(at_t, round_buffered(u_t, BUF)[None, :], u_buf)
    return u, u_buf


@triton.jit
def _load_copies(hi_ptr, lo_ptr, b, hv, vs, ks, HV, K, V, SHARED: tl.constexpr):
    """A chunked program's tile [BK, BV] (rows k, columns v) of both stored copies [B, HV, V, K] (S_lo is S_hi when
    SHARED), with its index into them, its mask and its element index in [HV, V, K] (`_store_round`'s counter)."""
    state_idx = ((b * HV + hv) * V + vs[None, :]).to(tl.int64) * K + ks[:, None]  # [BK, BV] into [B, HV, V, K]
    smask = (ks < K)[:, None] & (vs < V)[None, :]
    elem = (hv * V + vs[None, :]).to(tl.int64) * K + ks[:, None]  # element index in [HV, V, K]
    s_hi = tl.load(hi_ptr + state_idx, mask=smask, other=0.0)
    if SHARED:
        s_lo = s_hi
    else:
        s_lo = tl.load(lo_ptr + state_idx, mask=smask, other=0.0)
    return state_idx, smask, elem, s_hi, s_lo


@triton.jit
def _round_copies(folded, key_hi, key_lo, checkpoint, elem, smask, SHARED: tl.constexpr,
                  HI_KIND: tl.constexpr, HI_SCALE: tl.constexpr, HI_MAX: tl.constexpr,
                  LO_KIND: tl.constexpr, LO_SCALE: tl.constexpr, LO_MAX: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Both stored copies (S_hi, S_lo) of the fold tile at `checkpoint`, padding zero."""
    s_hi = _store_round(folded, key_hi, checkpoint, elem, HI_KIND, HI_SCALE, HI_MAX, BK, BV)
    s_hi = tl.where(smask, s_hi, 0.0)
    if SHARED:
        s_lo = s_hi
    else:
        s_lo = _store_round(folded, key_lo, checkpoint, elem, LO_KIND, LO_SCALE, LO_MAX, BK, BV)
        s_lo = tl.where(smask, s_lo, 0.0)
    return s_hi, s_lo


def _store_mode(fmt, whole_head: bool):
    """(kind, scale group, max) of the in-kernel store of `fmt`, or None when no program sees its scale group (blocks
    along V, MX blocks, a tensor-wide scale, a head scale with V > _MAX_HEAD_V, formats outside `triton_rounds`):
    then torch rounds that copy."""
    if not triton_rounds(fmt):
        return None
    if isinstance(fmt, ElementwiseFormat):
        return KINDS[fmt.base].value, _NONE.value, 1.0
    if isinstance(fmt, FP8Format):
        group, top = fmt.scale, fmt.max_value
    elif isinstance(fmt, NVFP4Format) and fmt.axis == "dstate":
        group, top = fmt.scale, 1.0
    else:
        return None
    if group == "tensor" or (group == "head" and not whole_head):
        return None
    return KINDS[fmt.base].value, _SCALES[group].value, top


def chunked_triton(p: Prepared, chunked, *, rounded: bool = True) -> tuple[torch.Tensor, ReplayState]:
    """backend="triton" of `chunked` (FP32 only) through the family's `chunked(p, hi_mode, lo_mode, launch)`; a copy
    whose rounding needs a reduction no program can do is rounded by torch between one-segment launches.

    rounded=False (for checks): the same launch (same tiling, so the same FP32 fold) but both stored copies are
    written in FP32, i.e. the returned state holds the kernel's folds before rounding; rounding them with
    `write_checkpoint` gives what rounded=True stores (the in-kernel rounding is bit-exact). A checkpoint copy that
    differs from the torch path's while these pre-round folds agree to FP32 accuracy is a rounding decision flipped
    by FP32 summation order, not a kernel error (benchmarks/gpu_check_delta.py, tests/kernels/test_delta_triton.py).
    """
    if p.dtype != torch.float32:
        raise ValueError(f"backend='triton' computes in FP32, got compute_dtype={p.dtype}; use backend='torch' for FP64")
    cfg = p.config
    dv = p.v.shape[-1]
    whole_head = dv <= _MAX_HEAD_V
    modes = [_store_mode(cfg.recur_format, whole_head), _store_mode(cfg.read_format, whole_head)]
    launch = chunked_launch_config(p.k.shape[-1], dv, any(m is not None and m[1] == _HEAD.value for m in modes))
    if not rounded:
        modes = [_IDENTITY] * 2
    return chunked(p, modes[0], modes[1], launch)


def chunked_launch_config(dk: int, dv: int, whole_head: bool) -> dict:
    """BV (v columns per program; the whole head for head scales), num_warps and DOT of `_chunked_kernel`, the H200
    sweep's best (benchmarks/layer_speed.py).

    DOT "tf32x3" (three TF32 products per FP32 product, about FP32 accuracy): 1.87x the "ieee" FMAs on the H200 at
    K = V = 128, and it flips stored-copy roundings about as often as another FP32 summation order does (0.16% vs
    0.11% of the fp16sr elements; BENCHMARKS.md, Chunked form). The interpreter computes every dot in FP32."""
    if whole_head:
        return {"BV": max(16, triton.next_power_of_2(dv)), "num_warps": 16, "DOT": "tf32x3"}
    return {"BV": min(max(16, triton.next_power_of_2(dv)), 32), "num_warps": 8, "DOT": "tf32x3"}


def run_segments(p: Prepared, seg: Segments, lp: int, hi_mode, lo_mode, launch: dict, kernel, inputs: tuple):
    """Walk the segments in launches of `kernel` (the family's `_chunked_kernel`) over blocks of segments.

    inputs: the family's leading kernel arguments; the kernel then takes fold, last, the checkpoint index at the
    block start, keys_hi, keys_lo, hi, lo, o, u, NS, the block start, HV, K, V and the shared constexprs. A copy
    without an in-kernel store (mode None) makes every launch one segment: the kernel keeps that copy's FP32 fold and
    `round_folded` rounds it for the sequences that folded before the next launch (the next segment's u's and outputs
    read S_lo, its fold S_hi). Returns o [B, T, HV, V] and the ReplayState after the call.
    """
    cfg, st = p.config, p.state
    bsz, seqlen, nv, dk = p.q.shape
    dv = p.v.shape[-1]
    hi = st.hi.float().clone().contiguous()
    lo = hi if cfg.shared else st.lo.float().clone().contiguous()
    keys_hi = sr_keys(cfg.seed, p.layer, p.seq_ids, RECUR_COPY)
    keys_lo = sr_keys(cfg.seed, p.layer, p.seq_ids, READ_COPY)
    outside = [(hi, cfg.recur_format, keys_hi)] if hi_mode is None else []  # (copy, format, keys) rounded by torch
    if lo_mode is None and not cfg.shared:
        outside.append((lo, cfg.read_format, keys_lo))
    o_pad = torch.empty(bsz, nv, seg.num, lp, dv, device=p.q.device)
    u_pad = torch.empty_like(o_pad)
    bk = max(16, triton.next_power_of_2(dk))
    bv = launch["BV"]
    grid = (bsz, nv, triton.cdiv(dv, bv))
    fold = seg.folds.to(torch.int32).contiguous()
    last = seg.last.to(torch.int32).contiguous()
    # one launch per block of segments keeps each launch's registers the same and lets long inputs stream
    per_segment = bsz * nv * lp * (2 * dk + 4 * dv + 2 * lp)
    fits = max(1, _BLOCK_ELEMENTS // max(per_segment, 1))  # at least one segment per launch, however large
    block = 1 if outside else min(triton.next_power_of_2(seg.num), 1 << (fits.bit_length() - 1))
    ckpt = (st.checkpoint[:, None] + seg.folds.cumsum(1) - seg.folds.long()).t().contiguous()  # [NS, B] at each start
    fold_host = seg.folds.t().tolist() if outside else None  # [NS][B], steers the rounding without device syncs
    hi_mode, lo_mode = hi_mode or _IDENTITY, lo_mode or _IDENTITY
    for start in range(0, seg.num, block):
        kernel[grid](
            *inputs, fold, last, ckpt[start], keys_hi, keys_lo, hi, lo, o_pad, u_pad,
            seg.num, start, nv, dk, dv,
            SEGS=block, LP=lp, BK=bk, BV=bv, CLOSED=cfg.gdn_fold == "closed", SHARED=cfg.shared,
            HI_KIND=hi_mode[0], HI_SCALE=hi_mode[1], HI_MAX=hi_mode[2],
            LO_KIND=lo_mode[0], LO_SCALE=lo_mode[1], LO_MAX=lo_mode[2],
            DOT=launch["DOT"], BUF=buffer_kind(cfg), num_warps=launch["num_warps"],
        )
        for copy, fmt, keys in outside:
            round_folded(copy, fmt, keys, ckpt[start] + 1, seg.folds[:, start], fold_host[start])
    o_seg = o_pad[..., : seg.length, :].movedim(1, 3)  # [B, NS, L, HV, V]
    u_seg = u_pad[..., : seg.length, :].movedim(1, 3)
    o_tok = o_seg.reshape(-1, nv, dv)[seg.tok_index.flatten()].view(bsz, seqlen, nv, dv)
    return o_tok, state_after(p, seg, hi, lo, st.checkpoint + p.plan.num_folds, u_seg)


# packed read-copy kinds of the step kernel
_P_F32, _P_F16, _P_BF16, _P_E4M3, _P_E5M2, _P_NVFP4 = map(tl.constexpr, range(6))
_S_NONE, _S_ROW, _S_HEAD, _S_TENSOR = map(tl.constexpr, range(4))


@triton.jit
def _decode_codes(raw, KIND: tl.constexpr):
    """FP32 values of one-byte or 16/32-bit read-copy elements (E4M3, E5M2 through FP16 bit patterns; others cast)."""
    if KIND == _P_E4M3:
        x = _e4m3_fast(raw)
    elif KIND == _P_E5M2:
        x = _e5m2_fast(raw)
    else:
        x = raw.to(tl.float32)
    return x


@triton.jit
def _load_packed(data_ptr, scales_ptr, gs_ptr, b, hv, vs, ks, HV, V, K, KP,
                 KIND: tl.constexpr, SCALE: tl.constexpr):
    """Decode the read copy's tile [BK, BV] (k, v) of (b, hv) from its packed encoding."""
    mask = (ks[:, None] < K) & (vs[None, :] < V)
    rowid = (b * HV + hv) * V + vs[None, :]  # format row (b, hv, v)
    if KIND == _P_NVFP4:
        byte = tl.load(data_ptr + rowid.to(tl.int64) * (KP // 2) + ks[:, None] // 2, mask=mask, other=0).to(tl.int32)
        nib = tl.where(ks[:, None] % 2 == 0, byte & 0xF, byte >> 4)
        sb = tl.load(scales_ptr + rowid.to(tl.int64) * (KP // 16) + ks[:, None] // 16, mask=mask, other=0)
        x = (e2m1_decode(nib) * e4m3_decode(sb))
    else:
        x = _decode_codes(tl.load(data_ptr + rowid.to(tl.int64) * K + ks[:, None], mask=mask, other=0), KIND)
    if SCALE == _S_ROW:
        x = x * tl.load(gs_ptr + rowid, mask=vs[None, :] < V, other=1.0)
    elif SCALE == _S_HEAD:
        x = x * tl.load(gs_ptr + b * HV + hv)
    elif SCALE == _S_TENSOR:
        x = x * tl.load(gs_ptr + b)
    return tl.where(mask, x, 0.0)


def _read_args(packed, fmt, hi):
    """(kind, scale group, data, scales, global scale, padded K) of the read copy for the step kernels: the packed
    encoding where they decode it (fp32/fp16/bf16, fp8 any scale, nvfp4 axis=dstate), else the decoded FP32 copy
    (or S_hi [B, HV, V, K] itself when there is no read copy). Unused pointers are `hi`."""
    dk = hi.shape[-1]
    kinds = {"fp32": _P_F32.value, "fp16": _P_F16.value, "fp16sr": _P_F16.value, "bf16": _P_BF16.value}
    groups = {"none": _S_NONE.value, "row": _S_ROW.value, "head": _S_HEAD.value, "tensor": _S_TENSOR.value}
    if packed is None:
        return _P_F32.value, _S_NONE.value, hi, hi, hi, dk
    if not triton_rounds(fmt):
        return _P_F32.value, _S_NONE.value, fmt.decode(packed).float().contiguous(), hi, hi, dk
    gs = hi if packed.global_scale is None else packed.global_scale.contiguous()
    if isinstance(fmt, ElementwiseFormat):
        return kinds[fmt.base], _S_NONE.value, packed.data.contiguous(), hi, hi, dk
    if isinstance(fmt, FP8Format):
        kind = (_P_E5M2 if fmt.base == "fp8e5m2" else _P_E4M3).value
        return kind, groups[fmt.scale], packed.data.contiguous(), hi, gs, dk
    if isinstance(fmt, NVFP4Format) and fmt.axis == "dstate":
        return _P_NVFP4.value, groups[fmt.scale], packed.data.contiguous(), packed.scales.contiguous(), gs, packed.data.shape[-1] * 2
    return _P_F32.value, _S_NONE.value, fmt.decode(packed).float().contiguous(), hi, hi, dk


def _read_format(config):
    return config.recur_format if config.shared else config.read_format


def decode_step(p: Prepared, q, initial_state, launch_step) -> tuple[torch.Tensor, ReplayState]:
    """One decode token (T = 1) for B sequences at their own phases: one launch of the family's single-token kernel
    through its `launch_replay_step` (`launch_step`).

    Non-flush rows read the packed read copy (ReplayState.lo_packed, written here at every checkpoint; a state
    without one is packed from its decoded read copy, which must round-trip exactly) and the buffer; flush rows read
    S_hi and the buffer, and the folded FP32 state is rounded to both copies and the read copy packed by
    `write_checkpoint_packed`. q: the token's q [B, 1, H, K] as given. Returns (o [B, 1, HV, V] FP32, ReplayState
    with lo_packed).
    """
    cfg, st = p.config, p.state
    if p.q.shape[1] != 1:
        raise ValueError(f"decode_step_triton decodes one token: q has T={p.q.shape[1]}, expected 1")
    fmt = _read_format(cfg)
    packed = st.lo_packed
    if isinstance(initial_state, torch.Tensor):
        packed = write_checkpoint_packed(to_format_layout(initial_state), cfg, p.layer, p.seq_ids, st.checkpoint)[2]
    elif packed is None:
        packed = fmt.encode(st.lo.contiguous())
        if not torch.equal(fmt.decode(packed), st.lo):
            raise ValueError("initial_state has no lo_packed and its read copy does not re-encode exactly; "
                             "start from the FP32 state or a state written by decode_step_triton")
    hi = st.hi.float().contiguous()
    count = st.schedule.count
    new = dict(q=q[:, 0].to(torch.float32), k=p.k_heads[:, 0], v=p.v[:, 0], g=p.g[:, 0], beta=p.beta[:, 0])
    fold, read_hi = p.plan.fold_after[:, 0], p.plan.read_hi[:, 0]
    u = torch.empty(new["v"].shape, device=hi.device)  # [B, HV, V]
    o = torch.empty_like(u)
    folds = bool(fold.any())
    folded = torch.empty_like(hi) if folds else u  # [B, HV, V, K] the FP32 fold of the folding rows
    launch_step(hi, packed, fmt, st.buffer, count, new, read_hi.to(torch.int8), fold.to(torch.int8), u, o, folded,
                folds=folds, closed=cfg.gdn_fold == "closed", groups=p.groups, eps=cfg.skip_read_below,
                buf_kind=buffer_kind(cfg))
    buf = {name: t.clone() for name, t in st.buffer.items()}
    rows = torch.arange(p.q.shape[0], device=p.q.device)
    entry = dict(new, u=cfg.round_buffered(u))
    for name, t in buf.items():
        t[rows, count] = entry[name]
    hi_out, lo_out, ckpt = st.hi, st.lo, st.checkpoint.clone()
    if folds:
        idx = fold.nonzero().flatten()
        new_hi, new_lo, new_packed = write_checkpoint_packed(folded[idx], cfg, p.layer, p.seq_ids[idx], ckpt[idx] + 1)
        hi_out = hi_out.clone()
        hi_out[idx] = new_hi
        lo_out = hi_out if cfg.shared else lo_out.clone()
        if not cfg.shared:
            lo_out[idx] = new_lo
        packed = _assign_packed(packed, idx, new_packed)
        ckpt[idx] += 1
        for t in buf.values():
            t[idx] = 0
    state = ReplayState(hi=hi_out, lo=lo_out, buffer=buf, schedule=p.schedule_after, checkpoint=ckpt,
                        seq_ids=p.seq_ids, layer=p.layer, lo_packed=packed)
    return o[:, None], state


def _assign_packed(packed, idx, new):
    """packed with the sequences idx replaced by `new` (all fields lead with the batch dim)."""
    fields = {}
    for name in packed.FIELDS:
        old, rep = getattr(packed, name), getattr(new, name)
        if old is not None:
            old = old.clone()
            old[idx] = rep
        fields[name] = old
    return type(packed)(packed.format, packed.shape, **fields)


def verify(p: Prepared, q, verify_triton) -> torch.Tensor:
    """Output-only verification of the call's T drafts appended after the committed entries of p's state, each
    sequence reading S_hi if `state.schedule.step_read_hi` else the read copy (as `speculative_decode_reference`),
    through the family's `verify_triton`. q: the drafts' q [B, T, H, K] as given. Returns o [B, T, HV, V] FP32."""
    cfg, st = p.config, p.state
    fmt = _read_format(cfg)
    packed = st.lo_packed if st.lo_packed is not None else fmt.encode(st.lo.contiguous())
    drafts = dict(q=q.to(torch.float32), k=p.k_heads, v=p.v, g=p.g, beta=p.beta)
    width = torch.full((q.shape[0],), q.shape[1], dtype=torch.int64, device=q.device)
    _, o = verify_triton(st.hi, packed, fmt, st.buffer, st.schedule.count, drafts, width, st.schedule.step_read_hi,
                         p.groups, cfg.skip_read_below)
    return o


def conventional_launch(kernel, q, k, v, g, beta, state, block_v, num_warps):
    """Launch the family's `_conventional_step_kernel` (one eager FP32 step, state [B, HV, V, K] updated in place)
    after checking every tensor is FP32 and contiguous; returns o [B, HV, V]."""
    batch, nv, dv, dk = state.shape
    groups = nv // q.shape[1]
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("state", state)):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 tensor, got {t.dtype} (contiguous={t.is_contiguous()})")
    o = torch.empty_like(v)
    grid = (batch, nv, triton.cdiv(dv, block_v))
    kernel[grid](q, k, v, g, beta, state, o, nv, groups, dk, dv, BK=triton.next_power_of_2(dk), BV=block_v, num_warps=num_warps)
    return o

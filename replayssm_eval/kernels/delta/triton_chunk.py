"""Triton pieces of the chunked kernels shared by the delta-rule families (gdn: scalar decay, kda: per-channel decay).

The families keep their own kernels where the math differs (a scalar decay per head is cheaper than a
per-channel one); what is the same for both lives here: the state layout [B, HV, V, K] and the formats
are the same, so are

- the jit helpers `store_round` (in-kernel rounding of a stored copy, Philox
  bits `tl.randint(key, (checkpoint << 32) + element)` as `replay.keys`), `load_copies`,
  `round_copies` (a program's tile of both stored copies), `load_residuals` and `store_residuals` (their
  error-feedback residuals), and `forward_substitution`, the chunked kernels' delta rule with rounded
  buffered u's;
- the host side of the chunked kernels: which copies round in-kernel (each format's `tile_codec`),
  whether they carry the call's residuals (`feedback_in_kernel`), the launch configuration, and the loop
  over segment blocks with the torch rounding between one-segment launches of a copy no program can
  round (`run_segments`).
A kernel takes a format as its codec's constexprs (`KernelCodec.args`: KIND, GROUP, MAX, ORDER; `KernelCodec.tile`:
ROWS, COLS; `KernelCodec.basis`: AXIS, ROT; `KernelCodec.random`: RANDOM; `KernelCodec.ef`: EF).
The step kernels' shared pieces are `triton_step`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import FP32_CODEC, Group, KernelCodec, tile_codec
from replayssm_eval.formats.device import (
    AXIS_HEADDIM, GROUP_DUAL, GROUP_HEAD, RESIDUAL_NONE, abs_sums, dual_axis_value, feedback_residual, feedback_target,
    quantize_tile, round_tile, state_bits,
)
from replayssm_eval.kernels.delta._common import Prepared
from replayssm_eval.kernels.delta.chunked import BLOCK_ELEMENTS, Segments, state_after
from replayssm_eval.kernels.head_exchange import (
    can_exchange, exchange_programs, shared_head_amax, shared_head_sums, sums_exchanged, ticket_ids,
)
from replayssm_eval.replay.buffer_round import buffer_kind, round_buffered
from replayssm_eval.replay.keys import READ_COPY, RECUR_COPY, sr_keys
from replayssm_eval.replay.state import ReplayState, carries_feedback, round_folded

_MAX_HEAD_V = 128  # largest V one program holds whole (needed by head scales and scale tiles taller than _BV)
_BV = 32  # v columns per program where no scale group spans more (fewer where V is smaller)


@triton.jit
def store_round(x, key, checkpoint, elem, exch_ptr, count_ptr, bh, rnd, tile, KIND: tl.constexpr,
                GROUP: tl.constexpr, MAX: tl.constexpr, ORDER: tl.constexpr, RANDOM: tl.constexpr, ROWS: tl.constexpr,
                COLS: tl.constexpr, AXIS: tl.constexpr, ROT: tl.constexpr, PROGRAMS: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr):
    """One stored copy of the state tile x [BK, BV] (rows k, columns v; padding zero), as `fmt.quantize`.

    Blocks along d_state (AXIS_DSTATE): a format row is one v column (amax over K), a scale tile ROWS v columns x
    COLS k rows, rotation runs along K; along head_dim (AXIS_HEADDIM): a format row is one k row (amax over V), a
    scale tile or block ROWS k rows x COLS v columns, rotation runs of ROT along V. A head, and the rows a rowcol
    column factor spans, are the whole tile; or, for a head scale of a format in its natural basis (`codec.natural`)
    with PROGRAMS > 1, the tiles of the head's PROGRAMS programs, which exchange their amax (`shared_head_amax`, at
    exchange rnd of exch_ptr, count_ptr; this program's tile: `tile`), and for dual-axis factors along head_dim
    (`sums_exchanged`) with PROGRAMS > 1 the tiles of v columns whose programs exchange the row sums over V
    (`shared_head_sums`).
    elem: [BK, BV] int64 element index in the [HV, V, K] layout; SR bits = randint(key, (checkpoint << 32) + elem) in
    RANDOM's word layout, whose pairs run along K, and bits (`device.state_bits`).
    """
    ks = tl.arange(0, BK)[:, None]  # [BK, 1] the element's index along the state's last dim (K)
    bits = state_bits(key, (checkpoint << 32) + elem, ks, KIND, RANDOM)
    if (GROUP == GROUP_HEAD) and (PROGRAMS > 1):
        amax = shared_head_amax(x, exch_ptr, count_ptr, bh, rnd, tile, ORDER, PROGRAMS)
        amax = amax + tl.zeros((BV, 1), tl.float32)
        y = tl.trans(quantize_tile(tl.trans(x), tl.trans(bits), amax, KIND, GROUP, MAX, ORDER, BV, BK))
    elif (GROUP == GROUP_DUAL) and (PROGRAMS > 1):  # the oriented [K, V] view: key rows whole, v columns here
        sums = shared_head_sums(abs_sums(x, 1), exch_ptr, count_ptr, bh, rnd, tile, PROGRAMS)
        y = dual_axis_value(x, sums[:, None], MAX, COLS)
    elif AXIS == AXIS_HEADDIM:  # the tile is the oriented [K, V] view
        y = round_tile(x, bits, KIND, GROUP, MAX, ORDER, ROWS, COLS, ROT, BK, BV)
    else:  # [BV, BK]: format rows are v columns, blocks run along K
        y = tl.trans(round_tile(tl.trans(x), tl.trans(bits), KIND, GROUP, MAX, ORDER, ROWS, COLS, ROT, BV, BK))
    return y


@triton.jit
def forward_substitution(a, r, ts, BUF: tl.constexpr, LP: tl.constexpr):
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
def program_place(ticket_ptr, HV, V, BV: tl.constexpr, TICKETS: tl.constexpr):
    """(v-block, value head, sequence) of a chunked program: from the grid (v-blocks, value heads, sequences), in
    whose order a GPU starts a head's programs one after another, or with TICKETS (an exchanging launch of more
    programs than the GPU holds at once) in the order the programs start (`ticket_ids`)."""
    if TICKETS:
        tile, hv, b = ticket_ids(ticket_ptr, tl.cdiv(V, BV), HV)
    else:
        tile, hv, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    return tile, hv, b


@triton.jit
def load_copies(hi_ptr, lo_ptr, b, hv, vs, ks, HV, K, V, SHARED: tl.constexpr):
    """A chunked program's tile [BK, BV] (rows k, columns v) of both stored copies [B, HV, V, K] (S_lo is S_hi when
    SHARED), with its index into them, its mask and its element index in [HV, V, K] (`store_round`'s counter)."""
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
def load_residuals(res_hi_ptr, res_lo_ptr, state_idx, smask, SHARED: tl.constexpr, HI_EF: tl.constexpr,
                   LO_EF: tl.constexpr):
    """The error-feedback residuals (e_hi, e_lo) of a program's tile, [BK, BV] from [B, HV, V, K] as `load_copies`;
    zero for a copy without feedback (and for S_lo when SHARED: a shared checkpoint keeps one residual, e_hi)."""
    e_hi = tl.zeros(state_idx.shape, tl.float32)
    e_lo = tl.zeros(state_idx.shape, tl.float32)
    if HI_EF != RESIDUAL_NONE:
        e_hi = tl.load(res_hi_ptr + state_idx, mask=smask, other=0.0)
    if (LO_EF != RESIDUAL_NONE) and (not SHARED):
        e_lo = tl.load(res_lo_ptr + state_idx, mask=smask, other=0.0)
    return e_hi, e_lo


@triton.jit
def store_residuals(res_hi_ptr, res_lo_ptr, state_idx, smask, e_hi, e_lo, SHARED: tl.constexpr,
                    HI_EF: tl.constexpr, LO_EF: tl.constexpr):
    """Write back the residuals `load_residuals` read (the copies with feedback only)."""
    if HI_EF != RESIDUAL_NONE:
        tl.store(res_hi_ptr + state_idx, e_hi, mask=smask)
    if (LO_EF != RESIDUAL_NONE) and (not SHARED):
        tl.store(res_lo_ptr + state_idx, e_lo, mask=smask)


@triton.jit
def round_copies(folded, e_hi, e_lo, key_hi, key_lo, checkpoint, elem, smask, exch_ptr, count_ptr, bh, tile, fold_no,
                 SHARED: tl.constexpr,
                 HI_KIND: tl.constexpr, HI_GROUP: tl.constexpr, HI_MAX: tl.constexpr, HI_ORDER: tl.constexpr,
                 HI_RANDOM: tl.constexpr, HI_ROWS: tl.constexpr, HI_COLS: tl.constexpr, HI_AXIS: tl.constexpr,
                 HI_ROT: tl.constexpr, HI_EF: tl.constexpr,
                 LO_KIND: tl.constexpr, LO_GROUP: tl.constexpr, LO_MAX: tl.constexpr, LO_ORDER: tl.constexpr,
                 LO_RANDOM: tl.constexpr, LO_ROWS: tl.constexpr, LO_COLS: tl.constexpr, LO_AXIS: tl.constexpr,
                 LO_ROT: tl.constexpr, LO_EF: tl.constexpr, PROGRAMS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Both stored copies (S_hi, S_lo) of the fold tile at `checkpoint`, padding zero, and their error-feedback
    residuals: a copy with feedback (HI_EF, LO_EF: `Residual`) rounds folded + e and keeps the new residual
    (`feedback_residual`), as `replay.state`'s checkpoint write. fold_no: the fold's number in the launch (from 1);
    with PROGRAMS > 1 each head-scaled copy exchanges its amax and each dual-axis one its row sums (`store_round`),
    the recurrence copy's first.
    Returns (s_hi, s_lo, e_hi, e_lo)."""
    HI_X: tl.constexpr = ((HI_GROUP == GROUP_HEAD) or (HI_GROUP == GROUP_DUAL)) and (PROGRAMS > 1)  # exchanges a fold
    LO_X: tl.constexpr = ((LO_GROUP == GROUP_HEAD) or (LO_GROUP == GROUP_DUAL)) and (PROGRAMS > 1) and (not SHARED)
    rnd = (fold_no - 1) * (HI_X + LO_X) + 1  # this fold's first exchange
    target = feedback_target(folded, e_hi, HI_EF)
    s_hi = store_round(target, key_hi, checkpoint, elem, exch_ptr, count_ptr, bh, rnd, tile, HI_KIND, HI_GROUP,
                       HI_MAX, HI_ORDER, HI_RANDOM, HI_ROWS, HI_COLS, HI_AXIS, HI_ROT, PROGRAMS, BK, BV)
    s_hi = tl.where(smask, s_hi, 0.0)
    if HI_EF != RESIDUAL_NONE:
        e_hi = tl.where(smask, feedback_residual(target, s_hi, HI_EF), 0.0)
    if SHARED:
        s_lo = s_hi
    else:
        target = feedback_target(folded, e_lo, LO_EF)
        s_lo = store_round(target, key_lo, checkpoint, elem, exch_ptr, count_ptr, bh, rnd + HI_X, tile, LO_KIND,
                           LO_GROUP, LO_MAX, LO_ORDER, LO_RANDOM, LO_ROWS, LO_COLS, LO_AXIS, LO_ROT, PROGRAMS, BK, BV)
        s_lo = tl.where(smask, s_lo, 0.0)
        if LO_EF != RESIDUAL_NONE:
            e_lo = tl.where(smask, feedback_residual(target, s_lo, LO_EF), 0.0)
    return s_hi, s_lo, e_hi, e_lo


def chunked_triton(p: Prepared, chunked, *, rounded: bool = True,
                   sums_bv: int = _BV) -> tuple[torch.Tensor, ReplayState]:
    """backend="triton" of `chunked` (FP32 only) through the family's `chunked(p, hi_codec, lo_codec, launch)`; a copy
    whose rounding needs a reduction no program can do (its `tile_codec` is None: a tensor-wide scale; a head scale,
    a two-axis (rowcol, dualaxis) scale, a row scale along V, or a scale tile, block or rotation run of more than one
    v column with V > 128; scale tiles, blocks or rotation runs of other than power-of-two sizes; rotation runs that
    do not tile K or V) is rounded by torch between one-segment launches. A copy with error feedback (ef=) rounds in
    the loop with its residual (`round_copies`); where such a copy is one torch rounds, the call runs the torch
    backend (`feedback_in_kernel`, `replay.state.chunked_backend`). A program holds all of K and 32 v
    columns, or the whole head where a copy's scale groups (column and dual-axis factors included), blocks along V or
    rotation runs along V span more; a head scale of a natural-basis format, and dual-axis factors along head_dim
    (V), span the head's programs where they can exchange its amax or their row sums (`exchange_programs`: compiled
    code on a GPU holding a head's programs at once), else they take the whole head too.
    Programs exchanging row sums hold `sums_bv` v columns (the family's fastest).

    rounded=False (for checks): the same launch (same tiling, so the same FP32 fold) but both stored copies are
    written in FP32, i.e. the returned state holds the kernel's folds before rounding; rounding them with
    `write_checkpoint` gives what rounded=True stores (the in-kernel rounding is bit-exact). A checkpoint copy that
    differs from the torch path's while these pre-round folds agree to FP32 accuracy is a rounding decision flipped
    by FP32 summation order, not a kernel error (benchmarks/gpu_check_delta.py, tests/kernels/test_delta_triton.py).
    """
    if p.dtype != torch.float32:
        raise ValueError(f"backend='triton' computes in FP32, got compute_dtype={p.dtype}; use backend='torch' for FP64")
    codecs = copy_codecs(p)
    if not carries_feedback(codecs, p.config):
        raise ValueError(f"the chunked Triton kernels do not carry the error-feedback residual of a copy torch rounds "
                         f"between launches ({p.config.name!r}); accepted: backend='torch'")
    dv = p.v.shape[-1]
    exchanged = [c for c in codecs if c is not None and (c.group == Group.HEAD or sums_exchanged(c))]
    spans = any(c is not None and c.spans(_BV) and c not in exchanged for c in codecs)
    launch = chunked_launch_config(p.k.shape[-1], dv, spans, sums_bv if any(map(sums_exchanged, exchanged)) else _BV)
    tiles = triton.cdiv(dv, launch["BV"])
    programs = 1 if spans else exchange_programs(codecs, tiles, p.q.device)
    if exchanged and not spans and programs == 1:  # no exchange: one program holds the head
        launch = chunked_launch_config(p.k.shape[-1], dv, True)
    launch["PROGRAMS"] = programs
    # exchanging programs in grid order where all fit the GPU at once, else numbered in start order (`ticket_ids`);
    # tickets cost registers (KDA's window-1 kernel 154 against 128) and ran the default slower on GDN (BENCHMARKS)
    launch["TICKETS"] = programs > 1 and not can_exchange(p.q.shape[0] * p.q.shape[2] * tiles, p.q.device)
    if not rounded:
        codecs = [FP32_CODEC] * 2
    return chunked(p, codecs[0], codecs[1], launch)


def copy_codecs(p: Prepared) -> list[KernelCodec | None]:
    """The codecs of (S_hi, S_lo) the loop rounds (`tile_codec` on the [V, K] head, whole in one program for
    V <= 128), None for a copy torch rounds."""
    dv = p.v.shape[-1]
    return [tile_codec(fmt, dv <= _MAX_HEAD_V, (dv, p.k.shape[-1])) for fmt in (p.config.recur_format,
                                                                                p.config.read_format)]


def feedback_in_kernel(p: Prepared) -> bool:
    """Whether the chunked kernels carry the call's error-feedback residuals: every copy that keeps one (`ef=`)
    rounds in the loop (a copy torch rounds between launches would need its residual there too)."""
    return carries_feedback(copy_codecs(p), p.config)


def chunked_launch_config(dk: int, dv: int, whole_head: bool, bv: int = _BV) -> dict:
    """BV (v columns per program: up to bv, or the whole head for scale groups, blocks or rotation runs spanning more
    columns: head scales without an exchange, tall scale tiles, blocks and runs along V), num_warps and DOT of
    `_chunked_kernel`, the H200 sweep's best (benchmarks/layer_speed.py).

    DOT "tf32x3" (three TF32 products per FP32 product, about FP32 accuracy): 1.87x the "ieee" FMAs on the H200 at
    K = V = 128, and it flips stored-copy roundings about as often as another FP32 summation order does (0.16% vs
    0.11% of the fp16sr elements; BENCHMARKS.md, Chunked form). The interpreter computes every dot in FP32."""
    if whole_head:
        return {"BV": max(16, triton.next_power_of_2(dv)), "num_warps": 16, "DOT": "tf32x3"}
    return {"BV": min(max(16, triton.next_power_of_2(dv)), bv), "num_warps": 8, "DOT": "tf32x3"}


def run_segments(p: Prepared, seg: Segments, lp: int, hi_codec: KernelCodec | None, lo_codec: KernelCodec | None,
                 launch: dict, kernel, inputs: tuple):
    """Walk the segments in launches of `kernel` (the family's `_chunked_kernel`) over blocks of segments.

    inputs: the family's leading kernel arguments; the kernel then takes fold, last, the checkpoint index at the
    block start, keys_hi, keys_lo, hi, lo, the copies' error-feedback residuals (read and written in place where the
    codec's `ef` says), o, u, the exchange's slots, counters and ticket, NS, the block start, HV, K, V and
    the shared constexprs; grid (v-blocks, value heads, sequences). A copy
    without an in-kernel store (codec None) makes every launch one segment: the kernel keeps that copy's FP32 fold and
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
    outside = [(hi, cfg.recur_format, keys_hi)] if hi_codec is None else []  # (copy, format, keys) rounded by torch
    # error-feedback residuals [B, HV, V, K], updated in place (`feedback_in_kernel`: every copy with one is in-loop)
    res_hi, res_lo = (st.residual[copy].contiguous() if copy in st.residual else hi for copy in (RECUR_COPY, READ_COPY))
    if lo_codec is None and not cfg.shared:
        outside.append((lo, cfg.read_format, keys_lo))
    o_pad = torch.empty(bsz, nv, seg.num, lp, dv, device=p.q.device)
    u_pad = torch.empty_like(o_pad)
    bk = max(16, triton.next_power_of_2(dk))
    bv, programs = launch["BV"], launch["PROGRAMS"]
    grid = (triton.cdiv(dv, bv), nv, bsz)  # v-blocks fastest: a GPU starts a head's programs one after another
    fold = seg.folds.to(torch.int32).contiguous()
    exch, count = fold, fold  # the exchange's slots, counters and ticket, unread by a launch without one
    if programs > 1:
        count = torch.zeros(bsz * nv + 1, dtype=torch.int32, device=p.q.device)  # the head's counters, the ticket
        if any(sums_exchanged(c) for c in (hi_codec, lo_codec) if c is not None):  # `shared_head_sums`
            exch = torch.empty(bsz * nv * 2 * programs * bk, dtype=torch.int64, device=p.q.device)
        else:  # `shared_head_amax`
            exch = torch.empty(bsz * nv * 2 * programs, dtype=torch.int32, device=p.q.device)
    last = seg.last.to(torch.int32).contiguous()
    # one launch per block of segments keeps each launch's registers the same and lets long inputs stream
    per_segment = bsz * nv * lp * (2 * dk + 4 * dv + 2 * lp)
    fits = max(1, BLOCK_ELEMENTS // max(per_segment, 1))  # at least one segment per launch, however large
    block = 1 if outside else min(triton.next_power_of_2(seg.num), 1 << (fits.bit_length() - 1))
    ckpt = (st.checkpoint[:, None] + seg.folds.cumsum(1) - seg.folds.long()).t().contiguous()  # [NS, B] at each start
    fold_host = seg.folds.t().tolist() if outside else None  # [NS][B], steers the rounding without device syncs
    hi_codec, lo_codec = hi_codec or FP32_CODEC, lo_codec or FP32_CODEC
    hi_kind, hi_group, hi_max, hi_order = hi_codec.args
    lo_kind, lo_group, lo_max, lo_order = lo_codec.args
    (hi_rows, hi_cols), (lo_rows, lo_cols) = hi_codec.tile, lo_codec.tile
    (hi_axis, hi_rot), (lo_axis, lo_rot) = hi_codec.basis, lo_codec.basis
    for start in range(0, seg.num, block):
        if programs > 1 and start:
            count.zero_()
        kernel[grid](
            *inputs, fold, last, ckpt[start], keys_hi, keys_lo, hi, lo, res_hi, res_lo, o_pad, u_pad, exch, count,
            count[-1:], seg.num, start, nv, dk, dv,
            SEGS=block, LP=lp, BK=bk, BV=bv, CLOSED=cfg.gdn_fold == "closed", SHARED=cfg.shared,
            HI_KIND=hi_kind, HI_GROUP=hi_group, HI_MAX=hi_max, HI_ORDER=hi_order, HI_RANDOM=hi_codec.random,
            HI_ROWS=hi_rows, HI_COLS=hi_cols, HI_AXIS=hi_axis, HI_ROT=hi_rot, HI_EF=int(hi_codec.ef),
            LO_KIND=lo_kind, LO_GROUP=lo_group, LO_MAX=lo_max, LO_ORDER=lo_order, LO_RANDOM=lo_codec.random,
            LO_ROWS=lo_rows, LO_COLS=lo_cols, LO_AXIS=lo_axis, LO_ROT=lo_rot, LO_EF=int(lo_codec.ef),
            PROGRAMS=programs, TICKETS=launch["TICKETS"], DOT=launch["DOT"], BUF=buffer_kind(cfg),
            num_warps=launch["num_warps"],
        )
        for copy, fmt, keys in outside:
            round_folded(copy, fmt, keys, ckpt[start] + 1, seg.folds[:, start], fold_host[start])
    o_seg = o_pad[..., : seg.length, :].movedim(1, 3)  # [B, NS, L, HV, V]
    u_seg = u_pad[..., : seg.length, :].movedim(1, 3)
    o_tok = o_seg.reshape(-1, nv, dv)[seg.tok_index.flatten()].view(bsz, seqlen, nv, dv)
    for copy, res in zip((RECUR_COPY, READ_COPY), (res_hi, res_lo)):
        if copy in st.residual:
            st.residual[copy] = res
    return o_tok, state_after(p, seg, hi, lo, st.checkpoint + p.plan.num_folds, u_seg)

"""Triton chunked kernel of ReplaySSM Gated DeltaNet (FP32 math: tl.dot with input_precision "tf32x3" or "ieee").

GDN's decay is one scalar per (token, value head), which these kernels use as such (cheaper than
KDA's per-channel kernels); what both families share (the stored-copy rounding, the packed
read-copy decoder, the segment loop and the step / verification entry points) is in
`kernels.delta` (`triton_chunk`, `triton_step`).

Each kernel is layered `_x_kernel` (Triton) -> `_x` (allocation, grid) -> public `x`; none is
autotuned (they update states). One program owns one (sequence, value head, block of BV value
columns): every GDN quantity of a value column depends only on that column of S, so V blocks
are independent. The state tile is S[:, v-block] in the HF layout [K, BV]; the stored copies are
[B, HV, V, K] (the formats' layout, see `_common`).

1. `chunked_triton` (backend="triton" of `gdn.chunked`): the checkpoint-independent part of every
   segment, (I + A)^-1, is solved batched in torch; one launch then walks the segments of each
   (sequence, head, v-block) in order: u's, outputs, the fold, and the rounding of both stored
   copies in-kernel (Philox bits `tl.randint(key, (checkpoint << 32) + element)`, as
   `replay.keys`), using the formats' device codecs (`formats.device`, by each format's kernel
   codec). In-kernel formats: fp32, bf16, fp16, fp16sr, fp8 / fp8sr / fp8e5m2 and int8 / int8sr /
   int16 / int16sr with scale=row|none|block:N (|head|tile:RxC|rowcol), N, R, C powers of two or 0, along K
   or (axis=headdim) along V; nvfp4 with scale=row (|head|rowcol); mxfp8, mxfp4 and Pimba's mx8 / mx8sr along K or V
   (SR with any bits= and rounds=); and any of these with
   rot=hadamard:N (runs of N along K or V, N a power of two dividing that dim; `modelopt:int8-hadamard`); STEPQuant's
   dualaxis along K or V; each with error feedback (ef=: the copy's residual loaded, fed into its rounding and
   stored back, `delta.triton_chunk.round_copies`). `rowcol`, `dualaxis`, tiles of more than 32 v rows and
   anything spanning more than one v column along V (row scales, blocks, rotation runs with axis=headdim) need the
   whole head in one program (used when V <= 128); so do `head` and `dualaxis` along V, unless the head's programs
   (of 32 columns, 16 for dual-axis factors: `SUMS_BV`) exchange its amax or row sums at each fold
   (`head_exchange.exchange_programs`: on a GPU that holds a head's programs at once; numbered in grid order where
   all of the launch's programs fit at once, else in start order, `ticket_ids`).
   A copy in a format whose scale group no single program sees (nvfp4:scale=tensor,
   fp8 and int scale=tensor, spans across v columns with V > 128, tiles of other sizes) is stored as the FP32 fold
   and rounded by torch
   (`write_checkpoint`'s encoding, keys and checkpoint indices) for the sequences that folded,
   between launches of one segment each: both copies feed the next segment.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.kernels.delta import triton_chunk as shared
from replayssm_eval.kernels.delta._common import Prepared, keep_checkpoint
from replayssm_eval.kernels.delta.chunked import Segments, pad_segments, segment_layout
from replayssm_eval.kernels.delta.triton_chunk import (  # jit helpers the kernel reads as globals
    forward_substitution, load_copies, load_residuals, program_place, round_copies, store_residuals,
)
from replayssm_eval.kernels.tile_dot import dot, window_rows
from replayssm_eval.replay.buffer_round import BUF_FP32

# v columns of a program exchanging dual-axis row sums: eight 16-column programs a head ran 1.08x four 32-column ones
# (`stepquant:dualaxis6`, Qwen3.5-4B's geometry, H100; BENCHMARKS.md, STEPQuant presets); KDA's did not (0.99x)
SUMS_BV = 16


@triton.jit
def _chunked_kernel(
    k_ptr, q_ptr, v_ptr, uk_ptr, gc_ptr, d_ptr, dc_ptr, dend_ptr, beta_ptr, rhi_ptr, pre_ptr, tinv_ptr, tinvc_ptr,
    fold_ptr, last_ptr, ckpt_ptr, key_hi_ptr, key_lo_ptr, hi_ptr, lo_ptr, res_hi_ptr, res_lo_ptr, o_ptr, u_ptr,
    exch_ptr, count_ptr, ticket_ptr,
    NS, s_begin, HV, K, V,
    SEGS: tl.constexpr, LP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, CLOSED: tl.constexpr, SHARED: tl.constexpr,
    HI_KIND: tl.constexpr, HI_GROUP: tl.constexpr, HI_MAX: tl.constexpr, HI_ORDER: tl.constexpr,
    HI_RANDOM: tl.constexpr, HI_ROWS: tl.constexpr, HI_COLS: tl.constexpr, HI_AXIS: tl.constexpr, HI_ROT: tl.constexpr,
    HI_EF: tl.constexpr,
    LO_KIND: tl.constexpr, LO_GROUP: tl.constexpr, LO_MAX: tl.constexpr, LO_ORDER: tl.constexpr,
    LO_RANDOM: tl.constexpr, LO_ROWS: tl.constexpr, LO_COLS: tl.constexpr, LO_AXIS: tl.constexpr, LO_ROT: tl.constexpr,
    LO_EF: tl.constexpr,
    PROGRAMS: tl.constexpr, TICKETS: tl.constexpr, DOT: tl.constexpr, BUF: tl.constexpr,
):
    # per (b, hv) row-major: k, q [NS, LP, K]; v, uk, o, u [NS, LP, V]; gc, d, dc, beta, rhi, pre [NS, LP];
    # tinv [NS, LP, LP] ((I + A)^-1, or with a buffer dtype A itself for `forward_substitution`); dend [NS];
    # per b: fold, last [NS], checkpoint index at s_begin, keys; hi, lo [B, HV, V, K] read at the start, written at
    # the end, and so are res_hi, res_lo, the copies' error-feedback residuals (HI_EF, LO_EF; else unread);
    # exch, count [B * HV]: PROGRAMS > 1, the exchange of a head scale's amax (`shared_head_amax`, exch
    # [B * HV, 2, PROGRAMS]) or of dual-axis row sums (`shared_head_sums`, exch [B * HV, 2, PROGRAMS, BK]);
    # ticket [1]: TICKETS, the programs' start order (`program_place`)
    tile, hv, b = program_place(ticket_ptr, HV, V, BV, TICKETS)
    vs = tile * BV + tl.arange(0, BV)
    ks = tl.arange(0, BK)
    ts = tl.arange(0, LP)
    vmask = vs < V
    kmask = ks < K
    bh = b * HV + hv
    state_idx, smask, elem, s_hi, s_lo = load_copies(hi_ptr, lo_ptr, b, hv, vs, ks, HV, K, V, SHARED)
    e_hi, e_lo = load_residuals(res_hi_ptr, res_lo_ptr, state_idx, smask, SHARED, HI_EF, LO_EF)
    checkpoint = tl.load(ckpt_ptr + b)
    first = checkpoint
    key_hi = tl.load(key_hi_ptr + b)
    key_lo = tl.load(key_lo_ptr + b)
    causal = ts[:, None] >= ts[None, :]
    # a constexpr trip count (segments past NS are skipped): the interpreter cannot loop to a runtime bound
    for j in range(SEGS):
        s = s_begin + j
        if s < NS:
            row = (bh * NS + s).to(tl.int64) * LP + ts  # [LP]
            kt = tl.load(k_ptr + row[:, None] * K + ks[None, :], mask=kmask[None, :], other=0.0)  # [LP, BK]
            qt = tl.load(q_ptr + row[:, None] * K + ks[None, :], mask=kmask[None, :], other=0.0)
            vt = tl.load(v_ptr + row[:, None] * V + vs[None, :], mask=vmask[None, :], other=0.0)  # [LP, BV]
            uk = tl.load(uk_ptr + row[:, None] * V + vs[None, :], mask=vmask[None, :], other=0.0)
            gc = tl.load(gc_ptr + row)
            d = tl.load(d_ptr + row)
            beta = tl.load(beta_ptr + row)
            rhi = tl.load(rhi_ptr + row) != 0
            pre = tl.load(pre_ptr + row) != 0
            tinv = tl.load(tinv_ptr + row[:, None] * LP + ts[None, :])  # [LP, LP]
            ks_hi = dot(kt, s_hi, DOT)  # [LP, BV]
            ks_src = tl.where(rhi[:, None], ks_hi, dot(kt, s_lo, DOT))
            rhs = tl.where(pre[:, None], uk, beta[:, None] * (vt - d[:, None] * ks_src))
            qs = tl.where(rhi[:, None], dot(qt, s_hi, DOT), dot(qt, s_lo, DOT)) * d[:, None]
            m = tl.where(causal, dot(qt, tl.trans(kt), DOT) * tl.exp(gc[:, None] - gc[None, :]), 0.0)
            if BUF == BUF_FP32:
                u = dot(tinv, rhs, DOT)
                o = qs + dot(m, u, DOT)
            else:  # u holds the buffered (rounded) u's; a token's own u enters its output as computed
                u_raw, u = forward_substitution(tinv, rhs, ts, BUF, LP)
                m_own = tl.sum(tl.where(ts[:, None] == ts[None, :], m, 0.0), axis=1)  # [LP] diagonal of m
                o = qs + dot(m, u, DOT) + m_own[:, None] * (u_raw - u)
            if tl.load(fold_ptr + b * NS + s) != 0:
                g_end = tl.load(gc_ptr + (bh * NS + s).to(tl.int64) * LP + LP - 1)
                d_end = tl.load(dend_ptr + bh * NS + s)
                kd = kt * tl.exp(g_end - gc)[:, None]  # [LP, BK]
                if CLOSED:
                    dc = tl.load(dc_ptr + row)
                    tinvc = tl.load(tinvc_ptr + row[:, None] * LP + ts[None, :])
                    uc = dot(tinvc, beta[:, None] * (vt - dc[:, None] * ks_hi), DOT)
                    folded = d_end * s_hi + dot(tl.trans(kd), uc, DOT)
                    last = tl.load(last_ptr + b * NS + s)
                    last_hi = tl.sum(tl.where(ts == last, rhi.to(tl.int32), 0), axis=0) != 0
                    o = tl.where((ts[:, None] == last) & last_hi, dot(qt, folded, DOT), o)
                else:
                    folded = d_end * s_hi + dot(tl.trans(kd), u, DOT)
                checkpoint += 1
                s_hi, s_lo, e_hi, e_lo = round_copies(
                    folded, e_hi, e_lo, key_hi, key_lo, checkpoint, elem, smask, exch_ptr, count_ptr, bh, tile,
                    checkpoint - first, SHARED, HI_KIND, HI_GROUP, HI_MAX, HI_ORDER, HI_RANDOM, HI_ROWS, HI_COLS,
                    HI_AXIS, HI_ROT, HI_EF, LO_KIND, LO_GROUP, LO_MAX, LO_ORDER, LO_RANDOM, LO_ROWS, LO_COLS, LO_AXIS,
                    LO_ROT, LO_EF, PROGRAMS, BK, BV)
            out = row[:, None] * V + vs[None, :]
            tl.store(o_ptr + out, o, mask=vmask[None, :])
            tl.store(u_ptr + out, u, mask=vmask[None, :])
    tl.store(hi_ptr + state_idx, s_hi, mask=smask)
    if not SHARED:
        tl.store(lo_ptr + state_idx, s_lo, mask=smask)
    store_residuals(res_hi_ptr, res_lo_ptr, state_idx, smask, e_hi, e_lo, SHARED, HI_EF, LO_EF)


def chunked_triton(p: Prepared, *, rounded: bool = True):
    """backend="triton" of `gdn.chunked` (FP32 only); `delta.triton_chunk.chunked_triton` with GDN's `_chunked`."""
    return shared.chunked_triton(p, _chunked, rounded=rounded, sums_bv=SUMS_BV)


def _padded_inputs(p: Prepared, seg: Segments, lp: int) -> list[torch.Tensor]:
    """The kernel's inputs on the segment grid, each [B, HV, NS, LP, ...] contiguous, padding zero: k, q [.., K];
    v, the carried u's [.., V]; g, beta; rhi (the token reads S_hi) and pre (a carried entry, its u known) as int32.
    One gather pads all of them (`pad_segments` of the inputs concatenated along their last dim)."""
    bsz, seqlen, nv, dk = p.q.shape
    dv = p.v.shape[-1]
    buf = p.state.buffer
    cap = buf["g"].shape[1]
    kb = buf["k"].repeat_interleave(p.groups, dim=2) if p.groups > 1 else buf["k"]  # [B, cap, HV, K]
    zeros = lambda *shape: torch.zeros(*shape, dtype=p.q.dtype, device=p.q.device)  # noqa: E731
    flag = lambda x: x.to(p.q.dtype)[..., None]  # noqa: E731
    read_hi = p.plan.read_hi[..., None].expand(bsz, seqlen, nv)
    tokens = torch.cat([p.k, p.q, p.v, zeros(bsz, seqlen, nv, dv), p.g[..., None], p.beta[..., None], flag(read_hi),
                        zeros(bsz, seqlen, nv, 1)], dim=-1)  # [B, T, HV, F]
    carried = [kb, zeros(bsz, cap, nv, dk), buf["v"] if "v" in buf else zeros(bsz, cap, nv, dv), buf["u"],
               buf["g"][..., None], buf["beta"][..., None] if "beta" in buf else zeros(bsz, cap, nv, 1),
               zeros(bsz, cap, nv, 1), torch.ones(bsz, cap, nv, 1, dtype=p.q.dtype, device=p.q.device)]
    x = pad_segments(seg, tokens, torch.cat([c.to(p.q.dtype) for c in carried], dim=-1))  # [B, NS, L, HV, F]
    x = torch.nn.functional.pad(x.movedim(3, 1), (0, 0, 0, lp - seg.length))  # [B, HV, NS, LP, F]
    k, q, v, u, *scalars = x.split([dk, dk, dv, dv, 1, 1, 1, 1], dim=-1)
    k, q, v, u = (t.contiguous() for t in (k, q, v, u))
    g, beta, rhi, pre = (t[..., 0].contiguous() for t in scalars)
    return [k, q, v, u, g, beta, rhi.to(torch.int32), pre.to(torch.int32)]


def _chunked(p: Prepared, hi_codec, lo_codec, launch: dict):
    """One `_chunked_kernel` launch per block of segments, on T = (I + A)^-1 (and the closed fold's) solved in torch.

    The segment loop and the rounding of copies no program can round: `delta.triton_chunk.run_segments`."""
    cfg = p.config
    device = p.q.device
    closed = cfg.gdn_fold == "closed"
    seg = segment_layout(p)
    lp = window_rows(seg.length)
    k_pad, q_pad, v_pad, uk_pad, g_pad, beta_pad, rhi, pre = _padded_inputs(p, seg, lp)
    gc = g_pad.cumsum(-1)
    eps = cfg.skip_read_below
    d = keep_checkpoint(gc, eps, False) * torch.exp(gc)
    g_end = gc[..., -1]
    d_end = keep_checkpoint(g_end, eps, False) * torch.exp(g_end)  # [B, HV, NS]
    dc = torch.exp(gc) * keep_checkpoint(g_end, eps, False)[..., None]
    incl = torch.ones(lp, lp, dtype=torch.bool, device=device).tril()
    decay = torch.exp((gc[..., :, None] - gc[..., None, :]).masked_fill(~incl, float("-inf")))
    a = (beta_pad[..., None] * decay * (k_pad @ k_pad.transpose(-1, -2))).tril(-1)
    eye = torch.eye(lp, device=device).expand_as(a)
    tinv_c = torch.linalg.solve_triangular(eye + a, eye, upper=False, unitriangular=True).contiguous() if closed else None
    a_open = a * (pre == 0)[..., None]  # carried entries keep their stored u
    if cfg.buffer_dtype == "fp32":
        tinv = torch.linalg.solve_triangular(eye + a_open, eye, upper=False, unitriangular=True).contiguous()
    else:  # rounded u's: the kernel substitutes forward on A itself
        tinv = a_open.contiguous()
    del decay, a, a_open
    inputs = (k_pad, q_pad, v_pad, uk_pad, gc, d, dc, d_end.contiguous(), beta_pad, rhi, pre, tinv, tinv_c if closed else tinv)
    return shared.run_segments(p, seg, lp, hi_codec, lo_codec, launch, _chunked_kernel, inputs)

"""Triton chunked kernel of ReplaySSM Kimi Delta Attention (FP32 math).

Each kernel is layered `_x_kernel` (Triton) -> `_x` (allocation, grid) -> public `x`; none is
autotuned (they update states). One program owns one (sequence, value head, block of value
columns): every KDA quantity of a value column depends only on that column of S, so value blocks
are independent. The stored copies are [B, HV, V, K] (the formats' layout, see `delta._common`). What
both delta-rule families share (the in-kernel rounding of a stored copy, the packed read-copy
decoder, the segment loop, the step and verification entry points) is in `kernels.delta`
(`triton_chunk`, `triton_step`); the kernels here and in `triton_step` are KDA's own because the per-channel decay
changes their math.

1. `chunked_triton` (backend="triton" of `kda.chunked`): every checkpoint-independent tensor of
   a segment (the solved WY rows u0, W_hi, W_lo, the decayed queries, the causal mixing M, the
   fold's decayed keys; `delta.chunked.precompute`, per channel) comes from torch; one launch then
   walks the segments of each (sequence, head, v-block) in order: u's, outputs, the fold, and
   the rounding of both stored copies in-kernel (Philox bits as `replay.keys`; the same formats as
   GDN's, `gdn.triton_chunk`). A copy in a format whose scale group no single program sees is stored
   as the FP32 fold and rounded by torch (`round_folded`) between one-segment launches, as for GDN.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.kernels.delta import triton_chunk as shared
from replayssm_eval.kernels.delta._common import Prepared
from replayssm_eval.kernels.delta.chunked import BLOCK_ELEMENTS, padded_inputs, precompute, segment_layout
from replayssm_eval.kernels.delta.triton_chunk import (  # jit helpers the kernel reads as globals
    forward_substitution, load_copies, load_residuals, program_place, round_copies, store_residuals,
)
from replayssm_eval.kernels.tile_dot import dot, window_rows
from replayssm_eval.replay.buffer_round import BUF_FP32


@triton.jit
def _chunked_kernel(
    u0_ptr, whi_ptr, wlo_ptr, qhi_ptr, qlo_ptr, m_ptr, kend_ptr, dend_ptr, u0c_ptr, wc_ptr, q_ptr, rhi_ptr, a_ptr,
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
    # per (b, hv) row-major: whi, wlo, qhi, qlo, kend, wc, q [NS, LP, K]; u0, u0c, o, u [NS, LP, V]; m [NS, LP, LP];
    # dend [NS, K]; rhi [NS, LP]; per b: fold, last [NS], checkpoint index at s_begin, keys;
    # hi, lo [B, HV, V, K] read at the start and written at the end, and so are res_hi, res_lo, the copies'
    # error-feedback residuals (HI_EF, LO_EF; else unread). With a buffer dtype (BUF) u0, whi, wlo hold the
    # unsolved r_v, r_hi, r_lo and a [NS, LP, LP] the strictly lower A of `forward_substitution` (else unused);
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
    # a constexpr trip count (segments past NS are skipped): the interpreter cannot loop to a runtime bound
    for j in range(SEGS):
        s = s_begin + j
        if s < NS:
            row = (bh * NS + s).to(tl.int64) * LP + ts  # [LP]
            rk = row[:, None] * K + ks[None, :]  # [LP, BK]
            rv = row[:, None] * V + vs[None, :]  # [LP, BV]
            w_hi = tl.load(whi_ptr + rk, mask=kmask[None, :], other=0.0)
            w_lo = tl.load(wlo_ptr + rk, mask=kmask[None, :], other=0.0)
            u = tl.load(u0_ptr + rv, mask=vmask[None, :], other=0.0) - dot(w_hi, s_hi, DOT) - dot(w_lo, s_lo, DOT)
            q_hi = tl.load(qhi_ptr + rk, mask=kmask[None, :], other=0.0)
            q_lo = tl.load(qlo_ptr + rk, mask=kmask[None, :], other=0.0)
            m = tl.load(m_ptr + row[:, None] * LP + ts[None, :])  # [LP, LP]
            o = dot(q_hi, s_hi, DOT) + dot(q_lo, s_lo, DOT)
            if BUF == BUF_FP32:
                o = o + dot(m, u, DOT)
            else:  # u holds the buffered (rounded) u's; a token's own u enters its output as computed
                a = tl.load(a_ptr + row[:, None] * LP + ts[None, :])  # [LP, LP]
                u_raw, u = forward_substitution(a, u, ts, BUF, LP)
                m_own = tl.sum(tl.where(ts[:, None] == ts[None, :], m, 0.0), axis=1)  # [LP] diagonal of m
                o = o + dot(m, u, DOT) + m_own[:, None] * (u_raw - u)
            if tl.load(fold_ptr + b * NS + s) != 0:
                d_end = tl.load(dend_ptr + (bh * NS + s).to(tl.int64) * K + ks, mask=kmask, other=0.0)  # [BK]
                k_end = tl.load(kend_ptr + rk, mask=kmask[None, :], other=0.0)  # [LP, BK]
                if CLOSED:
                    w_c = tl.load(wc_ptr + rk, mask=kmask[None, :], other=0.0)
                    u_c = tl.load(u0c_ptr + rv, mask=vmask[None, :], other=0.0) - dot(w_c, s_hi, DOT)
                    folded = d_end[:, None] * s_hi + dot(tl.trans(k_end), u_c, DOT)
                    last = tl.load(last_ptr + b * NS + s)
                    rhi = tl.load(rhi_ptr + row) != 0
                    last_hi = tl.sum(tl.where(ts == last, rhi.to(tl.int32), 0), axis=0) != 0
                    qt = tl.load(q_ptr + rk, mask=kmask[None, :], other=0.0)
                    o = tl.where((ts[:, None] == last) & last_hi, dot(qt, folded, DOT), o)
                else:
                    folded = d_end[:, None] * s_hi + dot(tl.trans(k_end), u, DOT)
                checkpoint += 1
                s_hi, s_lo, e_hi, e_lo = round_copies(
                    folded, e_hi, e_lo, key_hi, key_lo, checkpoint, elem, smask, exch_ptr, count_ptr, bh, tile,
                    checkpoint - first, SHARED, HI_KIND, HI_GROUP, HI_MAX, HI_ORDER, HI_RANDOM, HI_ROWS, HI_COLS,
                    HI_AXIS, HI_ROT, HI_EF, LO_KIND, LO_GROUP, LO_MAX, LO_ORDER, LO_RANDOM, LO_ROWS, LO_COLS, LO_AXIS,
                    LO_ROT, LO_EF, PROGRAMS, BK, BV)
            tl.store(o_ptr + rv, o, mask=vmask[None, :])
            tl.store(u_ptr + rv, u, mask=vmask[None, :])
    tl.store(hi_ptr + state_idx, s_hi, mask=smask)
    if not SHARED:
        tl.store(lo_ptr + state_idx, s_lo, mask=smask)
    store_residuals(res_hi_ptr, res_lo_ptr, state_idx, smask, e_hi, e_lo, SHARED, HI_EF, LO_EF)


def chunked_triton(p: Prepared, *, rounded: bool = True):
    """backend="triton" of `kda.chunked` (FP32 only); `delta.triton_chunk.chunked_triton` with KDA's `_chunked`."""
    return shared.chunked_triton(p, _chunked, rounded=rounded)


def _segment_tensors(p: Prepared, seg, lp: int) -> dict[str, torch.Tensor]:
    """`delta.chunked.precompute` of every segment, padded to LP entries, as contiguous [B, HV, NS, LP, ...] (d_end
    [B, HV, NS, K]); plus q and read_hi on the same grid."""
    bsz, _, nv, dk = p.q.shape
    dv = p.v.shape[-1]
    x = {name: _pad_length(t, 2 if name in ("pre", "read_hi") else 3, lp) for name, t in padded_inputs(p, seg).items()}
    closed = p.config.gdn_fold == "closed"
    substitute = p.config.buffer_dtype != "fp32"
    names = [*_solved_names(p.config), "q_hi", "q_lo", "m", "k_end", "d_end"] + (["a"] if substitute else []) \
        + (["u0_c", "w_c"] if closed else [])
    parts = {name: [] for name in names}
    block = max(1, BLOCK_ELEMENTS // max(bsz * nv * lp * (3 * dk + 4 * dv + 3 * lp + lp * dk), 1))
    for start in range(0, seg.num, block):
        blk = precompute({name: t[:, start:start + block] for name, t in x.items()}, p.config.skip_read_below, closed,
                         True, substitute)
        for name in names:
            parts[name].append(blk[name])
    out = {name: torch.cat(ts, 1).transpose(1, 2).contiguous() for name, ts in parts.items()}  # [B, HV, NS, ...]
    out["q"] = x["q"].transpose(1, 2).contiguous()
    out["read_hi"] = x["read_hi"][:, None].expand(bsz, nv, seg.num, lp).to(torch.int32).contiguous()
    return out


def _solved_names(config) -> tuple[str, str, str]:
    """The `precompute` tensors the kernel's u0, whi, wlo pointers take: the unsolved ones with a buffer dtype."""
    return ("u0", "w_hi", "w_lo") if config.buffer_dtype == "fp32" else ("r_v", "r_hi", "r_lo")


def _pad_length(t: torch.Tensor, dim: int, lp: int) -> torch.Tensor:
    """Zero-pad the segment-length dim `dim` of t to lp entries (padding entries are no-ops: g = k = beta = 0)."""
    shape = list(t.shape)
    shape[dim] = lp - shape[dim]
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def _chunked(p: Prepared, hi_codec, lo_codec, launch: dict):
    """One `_chunked_kernel` launch per block of segments on `_segment_tensors`; the segment loop and the rounding of
    copies no program can round: `delta.triton_chunk.run_segments`."""
    seg = segment_layout(p)
    lp = window_rows(seg.length)
    t = _segment_tensors(p, seg, lp)
    solved = [t[name] for name in _solved_names(p.config)]
    unused = solved[1]
    inputs = (*solved, t["q_hi"], t["q_lo"], t["m"], t["k_end"], t["d_end"],
              t.get("u0_c", unused), t.get("w_c", unused), t["q"], t["read_hi"], t.get("a", unused))
    return shared.run_segments(p, seg, lp, hi_codec, lo_codec, launch, _chunked_kernel, inputs)


# ---------------------------------------------------------------------------------------------- single-token step
#
# One token j per sequence after `count` committed entries i (k_i, u_i, g_i [K]). With gc_j [K] the log decay from the
# checkpoint through j, d = exp(gc_j) (0 where every channel is below skip_read_below) and a_i = exp(gc_j - gc_i) [K]:
#     u_j = beta_j (v_j - S_src^T (d k_j) - sum_i (k_j . a_i k_i) u_i)
#     o_j = S_src^T (d q_j) + sum_i (q_j . a_i k_i) u_i + (q_j . k_j) u_j

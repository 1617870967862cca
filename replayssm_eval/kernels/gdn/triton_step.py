"""Triton decode kernels of ReplaySSM Gated DeltaNet (FP32 math: tl.dot with input_precision "ieee", or FP32 FMAs).

Layering, tiling and what the delta-rule families share: as in `triton_chunk`'s docstring (one program per
(sequence, value head, block of value columns); stored copies [B, HV, V, K]).

1. `launch_replay_step` (`gdn.decode_step_triton`, and the fixed-buffer step, `delta.fixed_step`):
   one decode token for B sequences at their own phases on the single-token kernel `_replay_step_kernel`
   (no [K, V] tile, no tl.dot: the buffer terms are weighted sums of buffered u rows, the state terms two
   row dots S_src^T k, S_src^T q per v row in one pass over K in FP32 FMAs; see "single-token step"
   below). Non-flush rows read the packed read copy (NVFP4 nibbles + E4M3 block scales + FP32 global
   scale, FP8 codes + FP32 scales, or 16/32-bit elements) through the fast decoders of `formats.device`
   and the buffer, and write no state; flush rows read S_hi and the buffer and write the FP32 fold
   (open: the decayed buffered rows added; closed: the delta rule re-run over the buffered raw entries), which the host
   rounds to both copies with `write_checkpoint_packed` (one rounding, the read copy also packed). One
   launch where no row or every row folds; where some rows fold, a reading launch (FOLD off) for the rows
   that do not and a folding launch for those that do, each skipping the other's rows
   (`step_variants.step_launches`). `step_launch_config` gives its block sizes
   (benchmarks/kernel_speed.py sweeps them).
2. `verify_triton` (`gdn.verify`): output-only speculative verification of T drafts per sequence from a
   checkpoint copy and the committed buffer (drafts' u by forward substitution), no state write,
   on `_step_kernel` (the read copy tile and the buffer sum P as [K, BV] tiles).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import Kind
from replayssm_eval.kernels.delta.triton_step import (
    conventional_launch, load_packed, read_args, rowdots,
)
from replayssm_eval.kernels.step_variants import other_launch_row, read_hi_flags, row_reads_hi, step_launches
from replayssm_eval.kernels.tile_dot import dot  # a jit helper the kernels read as a global
from replayssm_eval.replay.buffer_round import round_buffered


@triton.jit
def _step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, width_ptr, bk_ptr, bu_ptr, bg_ptr, count_ptr,
    rhi_ptr, hi_ptr, data_ptr, scales_ptr, gs_ptr, u_ptr, o_ptr,
    HV, GROUPS, K, V, KP, CAP, eps,
    W: tl.constexpr, CP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KIND: tl.constexpr, GROUP: tl.constexpr,
    SKIP: tl.constexpr,
):
    # new entries: q, k [B, W, H, K]; v [B, W, HV, V]; g, beta [B, W, HV]; width [B] entries used (<= W)
    # buffer: k [B, CAP, H, K], u [B, CAP, HV, V], g [B, CAP, HV]; count [B] committed entries
    # rhi [B]: read S_hi (fp32 [B, HV, V, K]) instead of the packed read copy; out: u, o [B, W, HV, V]
    b = tl.program_id(0)
    hv = tl.program_id(1)
    vs = tl.program_id(2) * BV + tl.arange(0, BV)
    ks = tl.arange(0, BK)
    cs = tl.arange(0, CP)
    vmask = vs < V
    kmask = ks < K
    h = hv // GROUPS
    H = HV // GROUPS
    count = tl.load(count_ptr + b)
    width = tl.load(width_ptr + b)
    valid = cs < count
    if tl.load(rhi_ptr + b) != 0:
        state_idx = ((b * HV + hv) * V + vs[None, :]).to(tl.int64) * K + ks[:, None]
        src = tl.load(hi_ptr + state_idx, mask=kmask[:, None] & vmask[None, :], other=0.0)
    else:
        src = load_packed(data_ptr, scales_ptr, gs_ptr, b, hv, vs, ks, HV, V, K, KP, KIND, GROUP)
    # committed buffer: P = sum_i exp(G_h - gc_i) k_i u_i^T
    bk = tl.load(bk_ptr + ((b * CAP + cs[:, None]) * H + h).to(tl.int64) * K + ks[None, :], mask=valid[:, None] & kmask[None, :], other=0.0)
    bu = tl.load(bu_ptr + ((b * CAP + cs[:, None]) * HV + hv).to(tl.int64) * V + vs[None, :], mask=valid[:, None] & vmask[None, :], other=0.0)
    bg = tl.load(bg_ptr + (b * CAP + cs) * HV + hv, mask=valid, other=0.0)
    gcb = tl.cumsum(bg, axis=0)
    g_run = tl.sum(bg, axis=0)  # log decay from the checkpoint through the last entry so far
    p = dot(tl.trans(bk * tl.exp(g_run - gcb)[:, None]), bu, "ieee")  # [BK, BV]
    for j in range(W):
        if j < width:
            tok = (b * W + j) * H + h
            qj = tl.load(q_ptr + tok.to(tl.int64) * K + ks, mask=kmask, other=0.0)
            kj = tl.load(k_ptr + tok.to(tl.int64) * K + ks, mask=kmask, other=0.0)
            ent = (b * W + j) * HV + hv
            vj = tl.load(v_ptr + ent.to(tl.int64) * V + vs, mask=vmask, other=0.0)
            gj = tl.load(g_ptr + ent)
            betaj = tl.load(beta_ptr + ent)
            g_run = g_run + gj
            alpha = tl.exp(gj)
            d = tl.exp(g_run)
            if SKIP:
                d = tl.where(d >= eps, d, 0.0)
            a_prev = d * src + alpha * p  # alpha_j S_{j-1}
            u = betaj * (vj - tl.sum(a_prev * kj[:, None], axis=0))
            p = alpha * p + kj[:, None] * u[None, :]
            o = tl.sum((d * src + p) * qj[:, None], axis=0)
            tl.store(u_ptr + ent.to(tl.int64) * V + vs, u, mask=vmask)
            tl.store(o_ptr + ent.to(tl.int64) * V + vs, o, mask=vmask)


def _step(src_hi, packed, read_fmt, buffer, count, new, width, read_hi, groups, eps):
    """Launch `_step_kernel`. new: dict q, k [B, W, H, K], v [B, W, HV, V], g, beta [B, W, HV] (FP32)."""
    bsz, nw, nv, dv = new["v"].shape
    dk = new["k"].shape[-1]
    cap = buffer["k"].shape[1]
    kind, group, data, scales, gs, kp = read_args(packed, read_fmt, src_hi)
    u = torch.zeros(bsz, nw, nv, dv, device=src_hi.device)
    o = torch.zeros_like(u)
    bk = max(16, triton.next_power_of_2(dk))
    bv = min(max(16, triton.next_power_of_2(dv)), 64)
    grid = (bsz, nv, triton.cdiv(dv, bv))
    _step_kernel[grid](
        new["q"].contiguous(), new["k"].contiguous(), new["v"].contiguous(), new["g"].contiguous(), new["beta"].contiguous(),
        width.contiguous(), buffer["k"].contiguous(), buffer["u"].contiguous(), buffer["g"].contiguous(), count.contiguous(),
        read_hi.to(torch.int32).contiguous(), src_hi, data, scales, gs, u, o,
        nv, groups, dk, dv, kp, cap, float(eps or 0.0),
        W=nw, CP=max(16, triton.next_power_of_2(cap)), BK=bk, BV=bv, KIND=kind, GROUP=group, SKIP=eps is not None,
        num_warps=4,
    )
    return u, o


# ---------------------------------------------------------------------------------------------- single-token step
#
# One token j per sequence after `count` committed entries i (k_i, u_i, g_i). With d = exp(g_{0..j}) (the decay from
# the checkpoint through j; 0 below skip_read_below) and a_i = exp(g_{i+1..j}):
#     u_j = beta_j (v_j - d S_src^T k_j - sum_i a_i (k_j . k_i) u_i)
#     o_j = d S_src^T q_j + sum_i a_i (q_j . k_i) u_i + (q_j . k_j) u_j
# so no [K, V] tile is formed. `_replay_step_kernel`, per (sequence, value head, TILES blocks of BLOCK_V v rows): the
# weights a_i (k_j . k_i), a_i (q_j . k_i) once, then per v block the buffer's u rows and the two row dots
# S_src^T k_j, S_src^T q_j in one pass over the stored rows (K in chunks of BLOCK_K, FP32 FMAs, no tl.dot). Packed
# codes go through the fast decoders of `formats.device`; NVFP4 codes load as bytes split by nibble in a reading
# launch and as whole int32 words of 8 in a folding one (`delta.triton_step.nvfp4_partials`; each the faster there on
# an H200), and the block scale multiplies a 16-element or a word's partial sum.
# A folding sequence loads its whole FP32 S_hi block once (row dots and fold) and folds it by adding the decayed
# buffered u rows times their keys (open, `_fold_open`: one product from 16 entries, rank-1 updates below) or by
# re-running the delta rule over the buffered raw entries (closed). Where the whole block and an FP32 read's row dots
# overflow the registers (`fold_columns`: an open fold of 16 entries or more from an FP32 read copy, S_hi's included),
# it takes its row dots as a reading sequence does and folds BLOCK_K columns at a time instead (`_fold_open_columns`).


@triton.jit
def _delta(s, k, v, g, beta):
    """One delta-rule step of the state rows s [BLOCK_V, BK] (S^T): S = alpha S + k (beta (v - alpha S^T k))^T."""
    s = tl.exp(g) * s
    return s + (beta * (v - tl.sum(s * k[None, :], axis=1)))[:, None] * k[None, :]


@triton.jit
def _fold_open(s, bu, bk, a, offs_e, row0, count, bk_ptr, bu_ptr, h, hv, H, HV, offs_v, mask_v, ks, kmask,
               K: tl.constexpr, V: tl.constexpr, BLOCK_E: tl.constexpr):
    """s + sum_{i < count} a_i u_i k_i^T of the state rows s [BLOCK_V, columns ks]: from 16 entries one product of the
    loaded buffered rows bu [BLOCK_E, BLOCK_V] and keys bk [BLOCK_E, columns ks] (tl.dot in FP32 FMAs), below as rank-1
    updates (short windows: a padded product measured slower at window 1); row0 = b * CAP."""
    if BLOCK_E >= 16:
        s += dot(tl.trans(bu * a[:, None]), bk, "ieee")
    else:
        i = 0
        while i < count:  # a while loop: the interpreter cannot take range() of a runtime scalar
            r = row0 + i
            a_i = tl.sum(tl.where(offs_e == i, a, 0.0), axis=0)
            u_i = tl.load(bu_ptr + (r * HV + hv) * V + offs_v, mask=mask_v, other=0.0)
            k_i = tl.load(bk_ptr + (r * H + h) * K + ks, mask=kmask, other=0.0)
            s += (a_i * u_i)[:, None] * k_i[None, :]
            i += 1
    return s


@triton.jit
def _fold_open_columns(hi_ptr, out_ptr, kj_ptr, d, ub, bu, a, offs_e, mask_e, row0, count, bk_ptr, bu_ptr, h, hv, H,
                       HV, rows, offs_v, mask_v, K: tl.constexpr, V: tl.constexpr, BLOCK_E: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """Store the open fold d S_hi + ub k_j^T + sum_i a_i u_i k_i^T of the state rows `rows` [BLOCK_V] into out, BLOCK_K
    columns at a time: a column's fold needs only that column of S_hi and of the keys, so no whole [BLOCK_V, K] block
    (nor its product's operands) is live at once. ub: the token's u as buffered; bu [BLOCK_E, BLOCK_V]: the loaded
    buffered rows; kj_ptr: the token's k."""
    for c in tl.static_range(0, K, BLOCK_K):
        ks = c + tl.arange(0, BLOCK_K)
        kmask = ks < K
        m2 = mask_v[:, None] & kmask[None, :]
        s = tl.load(hi_ptr + rows[:, None] * K + ks[None, :], mask=m2, other=0.0)  # [BLOCK_V, BLOCK_K]
        kj = tl.load(kj_ptr + ks, mask=kmask, other=0.0)
        bk = tl.load(bk_ptr + ((row0 + offs_e)[:, None] * H + h) * K + ks[None, :],
                     mask=mask_e[:, None] & kmask[None, :], other=0.0)  # [BLOCK_E, BLOCK_K]
        s = _fold_open(d * s + ub[:, None] * kj[None, :], bu, bk, a, offs_e, row0, count, bk_ptr, bu_ptr, h, hv, H, HV,
                       offs_v, mask_v, ks, kmask, K, V, BLOCK_E)
        tl.store(out_ptr + rows[:, None] * K + ks[None, :], s, mask=m2)


@triton.jit
def _fold_closed(s, row0, count, bk_ptr, bv_ptr, bg_ptr, bbeta_ptr, h, hv, H, HV, offs_v, mask_v, ks, kmask,
                 K: tl.constexpr, V: tl.constexpr):
    """The delta rule from the state rows s [BLOCK_V, BK] over the buffered raw entries i < count; row0 = b * CAP."""
    i = 0
    while i < count:
        r = row0 + i
        k_i = tl.load(bk_ptr + (r * H + h) * K + ks, mask=kmask, other=0.0)
        v_i = tl.load(bv_ptr + (r * HV + hv) * V + offs_v, mask=mask_v, other=0.0)
        s = _delta(s, k_i, v_i, tl.load(bg_ptr + r * HV + hv), tl.load(bbeta_ptr + r * HV + hv))
        i += 1
    return s


@triton.jit
def _replay_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,  # the token: q, k [B, H, K]; v [B, HV, V]; g, beta [B, HV]
    bk_ptr, bu_ptr, bg_ptr, bv_ptr, bbeta_ptr,  # buffer k [B, CAP, H, K]; u, v [B, CAP, HV, V]; g, beta [B, CAP, HV]
    count_ptr,  # [B] committed entries
    rhi_ptr, fold_ptr,  # [B] int8: read S_hi instead of the read copy (unless HI_AT_FOLD); fold after the token
    hi_ptr, data_ptr, scale_ptr, gs_ptr,  # S_hi [B, HV, V, K] FP32 and the packed read copy
    u_ptr, o_ptr, out_ptr,  # u, o [B, HV, V]; out [B, HV, V, K] the FP32 fold of the folding sequences
    HV, GROUPS, CAP, eps,
    K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr,
    KIND: tl.constexpr, GROUP: tl.constexpr, SKIP: tl.constexpr, FOLD: tl.constexpr, SPLIT: tl.constexpr,
    HI_AT_FOLD: tl.constexpr, CLOSED: tl.constexpr, SHARED: tl.constexpr, BUF: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr, COLUMNS: tl.constexpr,
    WORDS: tl.constexpr = 0,  # how a reading row's NVFP4 codes load (`rowdots`; a folding row's as words in tiles)
):
    b = tl.program_id(0)
    if other_launch_row(fold_ptr, b, FOLD, SPLIT):  # some rows fold: the other launch takes this row
        return
    hv = tl.program_id(1)
    h = hv // GROUPS
    H = HV // GROUPS
    bh = b.to(tl.int64) * HV + hv
    tok = (b.to(tl.int64) * H + h) * K  # the token's q, k
    ks = tl.arange(0, BK)
    kmask = ks < K
    kj = tl.load(k_ptr + tok + ks, mask=kmask, other=0.0)  # [BK]
    qj = tl.load(q_ptr + tok + ks, mask=kmask, other=0.0)
    gj = tl.load(g_ptr + bh)
    beta = tl.load(beta_ptr + bh)
    # committed entries: decays a_i and the weights of u_i in the token's u and o, once per program
    count = tl.load(count_ptr + b)
    offs_e = tl.arange(0, BLOCK_E)
    mask_e = offs_e < count
    row0 = b.to(tl.int64) * CAP
    ent = row0 + offs_e  # [BLOCK_E] entry of [B, CAP]
    bg = tl.load(bg_ptr + ent * HV + hv, mask=mask_e, other=0.0)
    g_now = tl.sum(bg, axis=0) + gj  # log decay from the checkpoint through the token
    a = tl.where(mask_e, tl.exp(g_now - tl.cumsum(bg, axis=0)), 0.0)  # [BLOCK_E] a_i = exp(g_{i+1..j})
    bk = tl.load(bk_ptr + (ent[:, None] * H + h) * K + ks[None, :], mask=mask_e[:, None] & kmask[None, :], other=0.0)
    wk = a * tl.sum(bk * kj[None, :], axis=1)  # [BLOCK_E] a_i (k_j . k_i)
    wq = a * tl.sum(bk * qj[None, :], axis=1)  # [BLOCK_E] a_i (q_j . k_i)
    qk = tl.sum(qj * kj, axis=0)
    keep = 1.0
    do_read = True
    if SKIP:
        keep = tl.where(tl.exp(g_now) >= eps, 1.0, 0.0)
        do_read = keep != 0.0  # the checkpoint term is zeroed: skip its read
    d = keep * tl.exp(g_now)
    # the whole-block fold loads the flag even so: without it (and `folding`) it compiles for sm_90 to 255 registers
    # and 112 bytes of stack, with them to 128
    read_hi = row_reads_hi(rhi_ptr, b, FOLD, HI_AT_FOLD and (COLUMNS or not FOLD))
    folding = False
    if FOLD:
        folding = tl.load(fold_ptr + b) != 0
    for t in tl.static_range(TILES):
        offs_v = (tl.program_id(2) * TILES + t) * BLOCK_V + tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        rows = bh * V + offs_v  # [BLOCK_V] state row of [B, HV, V]
        bu = tl.load(bu_ptr + (ent[:, None] * HV + hv) * V + offs_v[None, :], mask=mask_e[:, None] & mask_v[None, :],
                     other=0.0)  # [BLOCK_E, BLOCK_V]
        vj = tl.load(v_ptr + bh * V + offs_v, mask=mask_v, other=0.0)
        pk = tl.sum(bu * wk[:, None], axis=0)  # [BLOCK_V] alpha_j P^T k_j
        pq = tl.sum(bu * wq[:, None], axis=0)  # [BLOCK_V] alpha_j P^T q_j
        if folding and not COLUMNS:  # the whole FP32 S_hi block, read once for the row dots (where read) and the fold
            m2 = mask_v[:, None] & kmask[None, :]
            s_hi = tl.load(hi_ptr + rows[:, None] * K + ks[None, :], mask=m2, other=0.0)  # [BLOCK_V, BK]
            if read_hi | SHARED:  # shared: the read copy holds S_hi's values
                sk = tl.sum(s_hi * kj[None, :], axis=1)
                sq = tl.sum(s_hi * qj[None, :], axis=1)
            else:
                sk, sq = rowdots(hi_ptr, data_ptr, scale_ptr, gs_ptr, k_ptr + tok, q_ptr + tok, b, bh, rows, mask_v,
                                 read_hi, K, KP, KIND, GROUP, BLOCK_V, BLOCK_K, FOLD)
            u = beta * (vj - d * sk - pk)
            o = d * sq + pq + qk * u
            if CLOSED:
                s = _fold_closed(keep * s_hi, row0, count, bk_ptr, bv_ptr, bg_ptr, bbeta_ptr, h, hv, H, HV, offs_v,
                                 mask_v, ks, kmask, K, V)
                s = _delta(s, kj, vj, gj, beta)
                if read_hi:  # the fold token's output comes from the closed-fold state
                    o = tl.sum(s * qj[None, :], axis=1)
            else:
                # the fold takes the token's u as buffered (rounded to the buffer dtype)
                s = _fold_open(d * s_hi + round_buffered(u, BUF)[:, None] * kj[None, :], bu, bk, a, offs_e, row0, count,
                               bk_ptr, bu_ptr, h, hv, H, HV, offs_v, mask_v, ks, kmask, K, V, BLOCK_E)
            tl.store(out_ptr + rows[:, None] * K + ks[None, :], s, mask=m2)
        elif folding:  # COLUMNS, an open fold: the row dots as a reading row takes them, then the fold by columns
            sk, sq = rowdots(hi_ptr, data_ptr, scale_ptr, gs_ptr, k_ptr + tok, q_ptr + tok, b, bh, rows, mask_v,
                             read_hi | SHARED, K, KP, KIND, GROUP, BLOCK_V, BLOCK_K, FOLD)  # shared: S_hi's values
            u = beta * (vj - d * sk - pk)
            o = d * sq + pq + qk * u
            # the fold takes the token's u as buffered (rounded to the buffer dtype)
            _fold_open_columns(hi_ptr, out_ptr, k_ptr + tok, d, round_buffered(u, BUF), bu, a, offs_e, mask_e, row0,
                               count, bk_ptr, bu_ptr, h, hv, H, HV, rows, offs_v, mask_v, K, V, BLOCK_E, BLOCK_K)
        else:
            sk = tl.zeros([BLOCK_V], dtype=tl.float32)
            sq = tl.zeros([BLOCK_V], dtype=tl.float32)
            if do_read:
                sk, sq = rowdots(hi_ptr, data_ptr, scale_ptr, gs_ptr, k_ptr + tok, q_ptr + tok, b, bh, rows, mask_v,
                                 read_hi, K, KP, KIND, GROUP, BLOCK_V, BLOCK_K, WORDS)
            u = beta * (vj - d * sk - pk)
            o = d * sq + pq + qk * u
        tl.store(u_ptr + rows, u, mask=mask_v)
        tl.store(o_ptr + rows, o, mask=mask_v)


def fold_columns(kind: int, closed: bool, cap: int) -> bool:
    """Whether a folding launch folds by columns (COLUMNS): an open fold of a window of 16 entries or more (its buffer
    sum a product) from an FP32 read copy (or S_hi itself), whose whole-block fold spills on an H200 (255 registers and
    96 bytes of stack at K = V = 128; by columns 138 registers: BENCHMARKS.md, Decode step)."""
    return kind == int(Kind.FP32) and not closed and cap >= 16


def step_launch_config(batch: int, heads: int, dk: int, dv: int, fold: bool = False, columns: bool = False) -> dict:
    """BLOCK_V, BLOCK_K (a multiple of 16: the columns of a pass over K, the read's and a fold's by columns), TILES (v
    blocks per program), WORDS (how a reading row's NVFP4 codes load, `rowdots`) and num_warps of `_replay_step_kernel`;
    fold: of a folding launch; columns: of one that folds by columns (`fold_columns`). benchmarks/kernel_speed.py tunes
    the reading launch."""
    if batch * heads < 4096:
        block_v = 16  # at least 16: the open fold's buffer sum is a tl.dot (`_fold_open`)
        return {"BLOCK_V": block_v, "BLOCK_K": min(128, max(16, triton.next_power_of_2(dk))), "TILES": 1,
                "WORDS": 0, "num_warps": 4}
    block_v = min(32, max(16, triton.next_power_of_2(dv)))
    block_k = min(64, max(16, triton.next_power_of_2(dk)))
    tiles = min(4, triton.cdiv(dv, block_v))
    if columns:  # one tile of 32-column passes: 138 registers at K = V = 128 (four tiles: 236)
        return {"BLOCK_V": block_v, "BLOCK_K": min(32, block_k), "TILES": 1, "WORDS": 0, "num_warps": 4}
    if fold:  # the whole block folded at once
        return {"BLOCK_V": block_v, "BLOCK_K": block_k, "TILES": tiles, "WORDS": 0, "num_warps": 4}
    # many sequences, a reading launch: the H200 sweep's best at K = V = 128, batch 256 for the FP32 and the NVFP4 read
    # copy (BENCHMARKS.md): one warp, a row a thread, NVFP4 words summed by rows
    return {"BLOCK_V": block_v, "BLOCK_K": block_k, "TILES": tiles, "WORDS": 2, "num_warps": 1}


def step_grid(batch: int, heads: int, dv: int, block_v: int, tiles: int) -> tuple[int, int, int]:
    return batch, heads, triton.cdiv(triton.cdiv(dv, block_v), tiles)


def launch_replay_step(hi, packed, read_fmt, buffer, count, new, read_hi, fold, u, o, out, *, folds, closed, shared,
                       groups, eps, buf_kind):
    """Launch `_replay_step_kernel`: one token per sequence after count[b] committed buffer entries, into the given
    tensors, with no allocation and no host sync (the launch of the eager step, `delta.triton_step.decode_step`, and of
    the static step, `kernels.static_step`). folds: the step variant, "none", "some" or "all" rows fold
    (`step_variants.FOLDS`); "some" launches the kernel twice (`step_variants.step_launches`): the reading path for
    the rows that do not fold and the folding path for those that do, each launch's programs of the other's rows
    returning at once, so a row's output never depends on whether other rows fold at this token.

    hi: S_hi [B, HV, V, K] FP32 (read where read_hi[b] or fold[b]); packed: the read copy, in read_fmt; buffer: k
    [B, CAP, H, K], u (v) [B, CAP, HV, V], g (beta) [B, CAP, HV] (v, beta: closed only); count [B] int64; new: q, k
    [B, H, K], v [B, HV, V], g, beta [B, HV] (FP32); read_hi [B] int8, or None where rows read S_hi exactly where
    they fold (a fixed window, `step_variants.read_hi_flags`); fold [B] int8 (fold after the token; closed: from the
    buffer's raw v, beta). Writes u (as computed) and o [B, HV, V] FP32, and unless folds is "none" the FP32 fold of
    the folding rows into out [B, HV, V, K], which may be hi itself (a program reads its rows of S_hi before writing
    them). buf_kind: `buffer_round.buffer_kind` of the config (an open fold takes the token's u rounded to it).
    shared: one stored copy (the read copy holds S_hi's values), so a folding row takes its row dots from S_hi (the
    block it loads for the fold, or in BLOCK_K columns where it folds by columns, `fold_columns`) instead of reading
    the read copy too.
    """
    bsz, nv, dv = new["v"].shape
    dk = new["k"].shape[-1]
    cap = buffer["k"].shape[1]
    kind, group, data, scales, gs, kp = read_args(packed, read_fmt, hi)
    token = [new[name].contiguous() for name in ("q", "k", "v", "g", "beta")]
    entries = [buffer.get(name, buffer["g"]).contiguous() for name in ("k", "u", "g", "v", "beta")]  # v, beta: closed only
    fold, count = fold.contiguous(), count.contiguous()
    read_hi, hi_at_fold = read_hi_flags(read_hi, fold)
    for fold_path, split in step_launches(folds):
        columns = fold_path and fold_columns(kind, closed, cap)
        cfg = step_launch_config(bsz, nv, dk, dv, fold_path, columns)
        _replay_step_kernel[step_grid(bsz, nv, dv, cfg["BLOCK_V"], cfg["TILES"])](
            *token, *entries, count, read_hi, fold,
            hi, data, scales, gs, u, o, out,
            nv, groups, cap, float(eps or 0.0),
            K=dk, V=dv, KP=kp, BK=triton.next_power_of_2(dk), KIND=kind, GROUP=group, SKIP=eps is not None,
            FOLD=fold_path, SPLIT=split, HI_AT_FOLD=hi_at_fold, CLOSED=closed, SHARED=shared, BUF=buf_kind,
            BLOCK_E=max(2, triton.next_power_of_2(cap)), COLUMNS=columns,
            **cfg,
        )


def verify_triton(src_hi, packed, read_fmt, buffer, count, drafts, width, read_hi, groups, eps=None):
    """Output-only speculative verification (no state write), one launch for B sequences.

    src_hi: S_hi [B, HV, V, K] FP32 (read where read_hi[b]); packed: the read copy (PackedState or None:
    then src_hi is read by every row); buffer: k [B, cap, H, K], u [B, cap, HV, V], g [B, cap, HV] with
    count[b] committed entries; drafts: dict q, k [B, T, H, K], v [B, T, HV, V], g, beta [B, T, HV];
    width [B] drafts used per sequence. Returns the drafts' u and outputs, [B, T, HV, V] each.
    """
    if packed is None:
        read_hi = torch.ones_like(read_hi)
    return _step(src_hi.float().contiguous(), packed, read_fmt, buffer, count, drafts, width, read_hi, groups, eps)


@triton.jit
def _conventional_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, o_ptr,  # q, k [B, H, K]; v, o [B, HV, V]; g, beta [B, HV]; state [B, HV, V, K]
    HV, GROUPS, K, V,
    BK: tl.constexpr, BV: tl.constexpr,
):
    b = tl.program_id(0)
    hv = tl.program_id(1)
    vs = tl.program_id(2) * BV + tl.arange(0, BV)
    ks = tl.arange(0, BK)
    vmask, kmask = vs < V, ks < K
    mask = vmask[:, None] & kmask[None, :]
    bh = b.to(tl.int64) * HV + hv
    s_off = (bh * V + vs[:, None]) * K + ks[None, :]  # [BV, BK] tile of S^T (the stored layout)
    s = tl.load(s_ptr + s_off, mask=mask, other=0.0)
    key = (b.to(tl.int64) * (HV // GROUPS) + hv // GROUPS) * K + ks
    q = tl.load(q_ptr + key, mask=kmask, other=0.0)
    k = tl.load(k_ptr + key, mask=kmask, other=0.0)
    v = tl.load(v_ptr + bh * V + vs, mask=vmask, other=0.0)
    s = tl.exp(tl.load(g_ptr + bh)) * s
    u = tl.load(beta_ptr + bh) * (v - tl.sum(s * k[None, :], axis=1))
    s = s + u[:, None] * k[None, :]
    tl.store(s_ptr + s_off, s, mask=mask)
    tl.store(o_ptr + bh * V + vs, tl.sum(s * q[None, :], axis=1), mask=vmask)


def conventional_step(q, k, v, g, beta, state, *, block_v=16, num_warps=4):
    """Conventional eager decoding of one token with an FP32 state (fused recurrent delta-rule step), the baseline
    the benchmarks compare ReplaySSM with: read the state, update it, write it back in place.

    q, k [B, H, K]; v [B, HV, V]; g, beta [B, HV]; state [B, HV, V, K] (the stored layout, as ReplayState.hi);
    all FP32 and contiguous. Returns o [B, HV, V]; `state` holds S_t afterwards (= decode_reference with "fp32").
    """
    return conventional_launch(_conventional_step_kernel, q, k, v, g, beta, state, block_v, num_warps)

"""Triton decode kernels of ReplaySSM Kimi Delta Attention (FP32 math).

Layering, tiling and what the delta-rule families share: as in `triton_chunk`'s docstring (one program per
(sequence, value head, block of value columns); stored copies [B, HV, V, K]).

1. `launch_replay_step` (`kda.decode_step_triton`, and the fixed-buffer step, `delta.fixed_step`):
   one decode token for B sequences at their own phases. For the sequences that do not fold,
   `_replay_step_kernel`: per (sequence, value head, block of BLOCK_V stored rows) one pass over K in
   chunks of BLOCK_K that forms the chunk's per-channel decays, its share of the buffer weights
   (k_j . exp(gc_j - gc_i) k_i), (q_j . exp(gc_j - gc_i) k_i) and of the row dots S_src^T (d k_j),
   S_src^T (d q_j), accumulated per column and reduced across columns once (the read copy decoded in
   registers; NVFP4 as whole int32 words of 8 codes, `delta.triton_step.nvfp4_partials`); then the
   buffer's u rows. `step_launch_config` gives its block sizes (benchmarks/kernel_speed.py sweeps them).
   For the sequences that fold, `_replay_fold_kernel`: per (sequence, value head, v-block) the buffer weights
   once over the whole of K, the read copy's [K, BV] tile (packed, decoded in-kernel; S_hi where the
   token reads it) dotted with the decayed d k_j and d q_j, and for a folding sequence the FP32 fold
   (open: the decayed buffer sum as one product; closed: the delta rule re-run over the buffered raw
   entries), which the host rounds to both copies. The two kernels' split is measured: the chunked
   pass reads faster, the whole-K tile folds faster (BENCHMARKS.md, Decode step).
2. `verify_triton`: output-only speculative verification of T drafts per sequence from a
   checkpoint copy and the committed buffer (drafts' u by forward substitution), no state write;
   `kda.verify` is it in the `KernelFamily` call convention.
3. `conventional_step`: the conventional FP32 eager step, the benchmarks' baseline.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.device import NVFP4, decode_elements
from replayssm_eval.kernels.delta.triton_step import (
    conventional_launch, load_packed, nvfp4_partials, read_args, scale_rows,
)
from replayssm_eval.kernels.step_variants import other_launch_row, step_launches
from replayssm_eval.replay.buffer_round import round_buffered


@triton.jit
def _replay_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,  # the token: q, k [B, H, K]; v [B, HV, V]; g [B, HV, K]; beta [B, HV]
    bk_ptr, bu_ptr, bg_ptr,  # buffer k [B, CAP, H, K]; u [B, CAP, HV, V]; g [B, CAP, HV, K]
    count_ptr,  # [B] committed entries
    rhi_ptr, fold_ptr,  # [B] int8: read S_hi instead of the read copy; fold after the token
    hi_ptr, data_ptr, scale_ptr, gs_ptr,  # S_hi [B, HV, V, K] FP32 and the packed read copy
    u_ptr, o_ptr,  # u, o [B, HV, V]
    HV, GROUPS, CAP, eps,
    K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr,
    KIND: tl.constexpr, GROUP: tl.constexpr, SKIP: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    b = tl.program_id(0)
    if other_launch_row(fold_ptr, b, False, SPLIT):  # SPLIT: the rows that do not fold only (`_replay_fold_kernel`)
        return
    hv = tl.program_id(1)
    h = hv // GROUPS
    H = HV // GROUPS
    bh = b.to(tl.int64) * HV + hv
    tok = (b.to(tl.int64) * H + h) * K
    offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < V
    rows = bh * V + offs_v  # [BLOCK_V] state row of [B, HV, V]
    beta = tl.load(beta_ptr + bh)
    count = tl.load(count_ptr + b)
    offs_e = tl.arange(0, BLOCK_E)
    mask_e = offs_e < count
    row0 = b.to(tl.int64) * CAP
    ent = row0 + offs_e  # [BLOCK_E] entry of [B, CAP]
    read_hi = tl.load(rhi_ptr + b) != 0
    keep = 1.0
    do_read = True
    if SKIP:  # the checkpoint term is zeroed where its slowest channel decayed below eps: skip its read
        g_max = -float("inf")
        for c in tl.static_range(0, K, BLOCK_K):
            ks = c + tl.arange(0, BLOCK_K)
            bg = tl.load(bg_ptr + (ent[:, None] * HV + hv) * K + ks[None, :], mask=mask_e[:, None] & (ks < K)[None, :],
                         other=0.0)
            g_c = tl.sum(bg, axis=0) + tl.load(g_ptr + bh * K + ks, mask=ks < K, other=0.0)
            g_max = tl.maximum(g_max, tl.max(tl.where(ks < K, g_c, -float("inf")), axis=0))
        keep = tl.where(tl.exp(g_max) >= eps, 1.0, 0.0)
        do_read = keep != 0.0
    # one pass over K in chunks of BLOCK_K: per chunk the channels' decays, the buffer weights' share and the stored
    # rows times the decayed token vectors, accumulated per column and reduced across columns once
    wk = tl.zeros([BLOCK_E], dtype=tl.float32)  # a_i (k_j . k_i) with per-channel a_i = exp(g_{i+1..j})
    wq = tl.zeros([BLOCK_E], dtype=tl.float32)
    qk = 0.0
    acc_k = tl.zeros([BLOCK_V, BLOCK_K], dtype=tl.float32)  # S_src^T (d k_j) per column (elementwise kinds, S_hi)
    acc_q = tl.zeros([BLOCK_V, BLOCK_K], dtype=tl.float32)
    acc_wk = tl.zeros([BLOCK_V, BLOCK_K // 8], dtype=tl.float32)  # the same per packed word (NVFP4)
    acc_wq = tl.zeros([BLOCK_V, BLOCK_K // 8], dtype=tl.float32)
    for c in tl.static_range(0, K, BLOCK_K):
        ks = c + tl.arange(0, BLOCK_K)
        kmask = ks < K
        kj = tl.load(k_ptr + tok + ks, mask=kmask, other=0.0)  # [BLOCK_K]
        qj = tl.load(q_ptr + tok + ks, mask=kmask, other=0.0)
        m_ek = mask_e[:, None] & kmask[None, :]
        bg = tl.load(bg_ptr + (ent[:, None] * HV + hv) * K + ks[None, :], mask=m_ek, other=0.0)  # [BLOCK_E, BLOCK_K]
        g_now = tl.sum(bg, axis=0) + tl.load(g_ptr + bh * K + ks, mask=kmask, other=0.0)  # checkpoint -> token
        a = tl.where(m_ek, tl.exp(g_now[None, :] - tl.cumsum(bg, axis=0)), 0.0)
        bk = tl.load(bk_ptr + (ent[:, None] * H + h) * K + ks[None, :], mask=m_ek, other=0.0) * a  # a_i k_i
        wk += tl.sum(bk * kj[None, :], axis=1)
        wq += tl.sum(bk * qj[None, :], axis=1)
        qk += tl.sum(qj * kj, axis=0)
        d = tl.where(kmask, keep * tl.exp(g_now), 0.0)  # [BLOCK_K]
        if do_read:
            if read_hi:
                tile = tl.load(hi_ptr + rows[:, None] * K + ks[None, :], mask=mask_v[:, None] & kmask[None, :],
                               other=0.0)
                acc_k += tile * (d * kj)[None, :]
                acc_q += tile * (d * qj)[None, :]
            elif KIND == NVFP4:
                pk, pq = nvfp4_partials(data_ptr, scale_ptr, rows, mask_v, d * kj, d * qj, c, KP, BLOCK_K)
                acc_wk += pk
                acc_wq += pq
            else:
                tile = decode_elements(tl.load(data_ptr + rows[:, None] * K + ks[None, :],
                                               mask=mask_v[:, None] & kmask[None, :], other=0), KIND)
                acc_k += tile * (d * kj)[None, :]
                acc_q += tile * (d * qj)[None, :]
    sk = tl.sum(acc_k, axis=1) + tl.sum(acc_wk, axis=1)  # [BLOCK_V] S_src^T (d k_j)
    sq = tl.sum(acc_q, axis=1) + tl.sum(acc_wq, axis=1)
    sk = tl.where(read_hi, sk, scale_rows(sk, gs_ptr, b, bh, rows, mask_v, GROUP))  # the read copy's global scale
    sq = tl.where(read_hi, sq, scale_rows(sq, gs_ptr, b, bh, rows, mask_v, GROUP))
    bu = tl.load(bu_ptr + (ent[:, None] * HV + hv) * V + offs_v[None, :], mask=mask_e[:, None] & mask_v[None, :],
                 other=0.0)  # [BLOCK_E, BLOCK_V]
    vj = tl.load(v_ptr + bh * V + offs_v, mask=mask_v, other=0.0)
    u = beta * (vj - sk - tl.sum(bu * wk[:, None], axis=0))
    o = sq + tl.sum(bu * wq[:, None], axis=0) + qk * u
    tl.store(u_ptr + rows, u, mask=mask_v)
    tl.store(o_ptr + rows, o, mask=mask_v)


@triton.jit
def _replay_fold_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,  # the token: q, k [B, H, K]; v [B, HV, V]; g [B, HV, K]; beta [B, HV]
    bk_ptr, bu_ptr, bg_ptr, bv_ptr, bbeta_ptr,  # buffer k [B, CAP, H, K]; u, v [B, CAP, HV, V]; g [B, CAP, HV, K]; beta [B, CAP, HV]
    count_ptr,  # [B] committed entries
    rhi_ptr, fold_ptr,  # [B] int8: read S_hi instead of the read copy; fold after the token
    hi_ptr, data_ptr, scale_ptr, gs_ptr,  # S_hi [B, HV, V, K] FP32 and the packed read copy
    u_ptr, o_ptr, out_ptr,  # u, o [B, HV, V]; out [B, HV, V, K] the FP32 fold of the folding sequences
    HV, GROUPS, CAP, K, V, KP, eps,
    BK: tl.constexpr, BV: tl.constexpr, BLOCK_E: tl.constexpr,
    KIND: tl.constexpr, GROUP: tl.constexpr, SKIP: tl.constexpr, CLOSED: tl.constexpr,
    BUF: tl.constexpr, SPLIT: tl.constexpr,
):
    b = tl.program_id(0)
    if other_launch_row(fold_ptr, b, True, SPLIT):  # SPLIT: the folding rows only (`_replay_step_kernel` the others)
        return
    hv = tl.program_id(1)
    vs = tl.program_id(2) * BV + tl.arange(0, BV)
    ks = tl.arange(0, BK)
    es = tl.arange(0, BLOCK_E)
    vmask, kmask = vs < V, ks < K
    h = hv // GROUPS
    H = HV // GROUPS
    bh = b.to(tl.int64) * HV + hv
    tok = (b.to(tl.int64) * H + h) * K
    kj = tl.load(k_ptr + tok + ks, mask=kmask, other=0.0)  # [BK]
    qj = tl.load(q_ptr + tok + ks, mask=kmask, other=0.0)
    gj = tl.load(g_ptr + bh * K + ks, mask=kmask, other=0.0)
    beta = tl.load(beta_ptr + bh)
    count = tl.load(count_ptr + b)
    valid = es < count
    ent = b.to(tl.int64) * CAP + es  # [BLOCK_E] entry of [B, CAP]
    m_ek = valid[:, None] & kmask[None, :]
    bg = tl.load(bg_ptr + (ent[:, None] * HV + hv) * K + ks[None, :], mask=m_ek, other=0.0)  # [BLOCK_E, BK]
    g_now = tl.sum(bg, axis=0) + gj  # [BK] log decay from the checkpoint through the token
    a = tl.where(m_ek, tl.exp(g_now[None, :] - tl.cumsum(bg, axis=0)), 0.0)  # [BLOCK_E, BK]
    bk = tl.load(bk_ptr + (ent[:, None] * H + h) * K + ks[None, :], mask=m_ek, other=0.0) * a  # a_i k_i
    wk = tl.sum(bk * kj[None, :], axis=1)  # [BLOCK_E]
    wq = tl.sum(bk * qj[None, :], axis=1)
    keep = 1.0
    if SKIP:
        keep = tl.where(tl.exp(tl.max(tl.where(kmask, g_now, -float("inf")), axis=0)) >= eps, 1.0, 0.0)
    d = tl.where(kmask, keep * tl.exp(g_now), 0.0)  # [BK]
    read_hi = tl.load(rhi_ptr + b) != 0
    folding = tl.load(fold_ptr + b) != 0
    smask = kmask[:, None] & vmask[None, :]
    state_idx = (bh * V + vs[None, :]) * K + ks[:, None]  # [BK, BV] into [B, HV, V, K]
    if read_hi | folding:
        s_hi = tl.load(hi_ptr + state_idx, mask=smask, other=0.0)
    else:
        s_hi = tl.zeros([BK, BV], dtype=tl.float32)
    if read_hi:
        src = s_hi
    else:
        src = load_packed(data_ptr, scale_ptr, gs_ptr, b, hv, vs, ks, HV, V, K, KP, KIND, GROUP)
    bu = tl.load(bu_ptr + (ent[:, None] * HV + hv) * V + vs[None, :], mask=valid[:, None] & vmask[None, :], other=0.0)
    vj = tl.load(v_ptr + bh * V + vs, mask=vmask, other=0.0)
    u = beta * (vj - tl.sum(src * (d * kj)[:, None], axis=0) - tl.sum(bu * wk[:, None], axis=0))
    o = tl.sum(src * (d * qj)[:, None], axis=0) + tl.sum(bu * wq[:, None], axis=0) + tl.sum(qj * kj, axis=0) * u
    if folding:
        if CLOSED:
            s = keep * s_hi
            i = 0
            while i < count:  # a while loop: the interpreter cannot take range() of a runtime scalar
                r = b.to(tl.int64) * CAP + i
                k_i = tl.load(bk_ptr + (r * H + h) * K + ks, mask=kmask, other=0.0)
                s = tl.exp(tl.load(bg_ptr + (r * HV + hv) * K + ks, mask=kmask, other=0.0))[:, None] * s
                v_i = tl.load(bv_ptr + (r * HV + hv) * V + vs, mask=vmask, other=0.0)
                u_i = tl.load(bbeta_ptr + r * HV + hv) * (v_i - tl.sum(s * k_i[:, None], axis=0))
                s += k_i[:, None] * u_i[None, :]
                i += 1
            s = tl.exp(gj)[:, None] * s
            s += kj[:, None] * (beta * (vj - tl.sum(s * kj[:, None], axis=0)))[None, :]
            if read_hi:  # the fold token's output comes from the closed-fold state
                o = tl.sum(s * qj[:, None], axis=0)
        else:
            # the fold takes the token's u as buffered (rounded to the buffer dtype)
            s = d[:, None] * s_hi + tl.dot(tl.trans(bk), bu, input_precision="ieee") \
                + kj[:, None] * round_buffered(u, BUF)[None, :]
        tl.store(out_ptr + state_idx, s, mask=smask)
    tl.store(u_ptr + bh * V + vs, u, mask=vmask)
    tl.store(o_ptr + bh * V + vs, o, mask=vmask)


def step_launch_config(batch: int, heads: int, dk: int, dv: int, kind: int) -> dict:
    """BLOCK_V (state rows per program), BLOCK_K (columns per pass, a multiple of 16) and num_warps of
    `_replay_step_kernel` (benchmarks/kernel_speed.py sweeps them). Many sequences: the fewest SASS instructions per
    head without spills at K = V = 128 (benchmarks/step_sass.py), measured faster than the whole-K kernel on an
    H200 (BENCHMARKS.md, Decode step): one program per head for the NVFP4 read, two for 32-bit reads."""
    block_k = min(32, max(16, triton.next_power_of_2(dk)))
    if batch * heads < 4096:
        return {"BLOCK_V": 16, "BLOCK_K": block_k, "num_warps": 4}
    block_v = 128 if kind == NVFP4 else 64
    return {"BLOCK_V": min(block_v, max(16, triton.next_power_of_2(dv))), "BLOCK_K": block_k, "num_warps": 4}


def fold_launch_config(batch: int, heads: int, dv: int) -> dict:
    """BV (v columns per program) and num_warps of `_replay_fold_kernel`: its [BK, BV] tiles hold the whole of K, so
    the one-pass chunked kernel's blocks measured slower there (BENCHMARKS.md, Decode step)."""
    return {"BV": min(32 if batch * heads >= 4096 else 16, max(16, triton.next_power_of_2(dv))), "num_warps": 4}


def step_grid(batch: int, heads: int, dv: int, block_v: int) -> tuple[int, int, int]:
    return batch, heads, triton.cdiv(dv, block_v)


def launch_replay_step(hi, packed, read_fmt, buffer, count, new, read_hi, fold, u, o, out, *, folds, closed, groups,
                       eps, buf_kind):
    """Launch `_replay_step_kernel` for the rows that do not fold and `_replay_fold_kernel` for those that do: one token
    per sequence after count[b] committed buffer entries, into the given tensors, with no allocation and no host sync
    (the launch of the eager step, `delta.triton_step.decode_step`, and of the static step, `kernels.static_step`).
    folds: the step variant, "none", "some" or "all" rows fold (`step_variants.FOLDS`); "some" launches both kernels,
    each skipping the other's rows (`step_variants.step_launches`), so a row's output never depends on whether
    other rows fold at this token.

    hi: S_hi [B, HV, V, K] FP32 (read where read_hi[b] or fold[b]); packed: the read copy, in read_fmt; buffer: k
    [B, CAP, H, K], u (v) [B, CAP, HV, V], g [B, CAP, HV, K] (beta [B, CAP, HV]; v, beta: closed only); count [B]
    int64; new: q, k [B, H, K], v [B, HV, V], g [B, HV, K], beta [B, HV] (FP32); read_hi, fold [B] int8 (fold after
    the token). Writes u (as computed) and o [B, HV, V] FP32, and unless folds is "none" the FP32 fold of
    the folding rows into out [B, HV, V, K], which may be hi itself (a program reads its rows of S_hi before writing
    them). buf_kind: `buffer_round.buffer_kind` of the config (an open fold takes the token's u rounded to it).
    """
    bsz, nv, dv = new["v"].shape
    dk = new["k"].shape[-1]
    cap = buffer["k"].shape[1]
    kind, group, data, scales, gs, kp = read_args(packed, read_fmt, hi)
    token = [new[name].contiguous() for name in ("q", "k", "v", "g", "beta")]
    block_e = max(16, triton.next_power_of_2(cap))
    read_hi, fold, count = read_hi.contiguous(), fold.contiguous(), count.contiguous()
    for fold_path, split in step_launches(folds):
        if fold_path:
            cfg = fold_launch_config(bsz, nv, dv)
            # v, beta: closed only
            entries = [buffer.get(name, buffer["g"]).contiguous() for name in ("k", "u", "g", "v", "beta")]
            _replay_fold_kernel[step_grid(bsz, nv, dv, cfg["BV"])](
                *token, *entries, count, read_hi, fold,
                hi, data, scales, gs, u, o, out,
                nv, groups, cap, dk, dv, kp, float(eps or 0.0),
                BK=max(16, triton.next_power_of_2(dk)), BLOCK_E=block_e, KIND=kind, GROUP=group, SKIP=eps is not None,
                CLOSED=closed, BUF=buf_kind, SPLIT=split, **cfg,
            )
        else:
            cfg = step_launch_config(bsz, nv, dk, dv, kind)
            entries = [buffer[name].contiguous() for name in ("k", "u", "g")]
            _replay_step_kernel[step_grid(bsz, nv, dv, cfg["BLOCK_V"])](
                *token, *entries, count, read_hi, fold, hi, data, scales, gs, u, o,
                nv, groups, cap, float(eps or 0.0),
                K=dk, V=dv, KP=kp, KIND=kind, GROUP=group, SKIP=eps is not None, SPLIT=split, BLOCK_E=block_e, **cfg,
            )


@triton.jit
def _verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, width_ptr, bk_ptr, bu_ptr, bg_ptr, count_ptr,
    rhi_ptr, hi_ptr, data_ptr, scales_ptr, gs_ptr, u_ptr, o_ptr,
    HV, GROUPS, K, V, KP, CAP, eps,
    W: tl.constexpr, CP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KIND: tl.constexpr, GROUP: tl.constexpr,
    SKIP: tl.constexpr,
):
    # drafts: q, k [B, W, H, K]; v [B, W, HV, V]; g [B, W, HV, K]; beta [B, W, HV]; width [B] drafts used (<= W)
    # buffer: k [B, CAP, H, K], u [B, CAP, HV, V], g [B, CAP, HV, K]; count [B] committed entries
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
    # committed buffer: P = sum_i diag(exp(G_h - gc_i)) k_i u_i^T  [BK, BV]
    m_ck = valid[:, None] & kmask[None, :]
    ent = (b * CAP + cs).to(tl.int64)
    bk = tl.load(bk_ptr + (ent[:, None] * H + h) * K + ks[None, :], mask=m_ck, other=0.0)
    bu = tl.load(bu_ptr + (ent[:, None] * HV + hv) * V + vs[None, :], mask=valid[:, None] & vmask[None, :], other=0.0)
    bg = tl.load(bg_ptr + (ent[:, None] * HV + hv) * K + ks[None, :], mask=m_ck, other=0.0)
    g_run = tl.sum(bg, axis=0)  # [BK] log decay from the checkpoint through the last entry so far
    p = tl.dot(tl.trans(tl.where(m_ck, bk * tl.exp(g_run[None, :] - tl.cumsum(bg, axis=0)), 0.0)), bu,
               input_precision="ieee")
    for j in range(W):
        if j < width:
            tok = ((b * W + j) * H + h).to(tl.int64) * K
            qj = tl.load(q_ptr + tok + ks, mask=kmask, other=0.0)
            kj = tl.load(k_ptr + tok + ks, mask=kmask, other=0.0)
            ent_j = ((b * W + j) * HV + hv).to(tl.int64)
            vj = tl.load(v_ptr + ent_j * V + vs, mask=vmask, other=0.0)
            gj = tl.load(g_ptr + ent_j * K + ks, mask=kmask, other=0.0)
            betaj = tl.load(beta_ptr + ent_j)
            g_run = g_run + gj
            alpha = tl.exp(gj)
            d = tl.where(kmask, tl.exp(g_run), 0.0)
            if SKIP:
                d = tl.where(tl.max(d, axis=0) >= eps, d, 0.0)
            s_dec = d[:, None] * src + alpha[:, None] * p  # A_j S_{j-1}
            u = betaj * (vj - tl.sum(s_dec * kj[:, None], axis=0))
            p = alpha[:, None] * p + kj[:, None] * u[None, :]
            o = tl.sum((d[:, None] * src + p) * qj[:, None], axis=0)
            tl.store(u_ptr + ent_j * V + vs, u, mask=vmask)
            tl.store(o_ptr + ent_j * V + vs, o, mask=vmask)


def verify_triton(src_hi, packed, read_fmt, buffer, count, drafts, width, read_hi, groups, eps=None):
    """Output-only speculative verification (no state write), one launch for B sequences.

    src_hi: S_hi [B, HV, V, K] FP32 (read where read_hi[b]); packed: the read copy (PackedState or None:
    then src_hi is read by every row); buffer: k [B, cap, H, K], u [B, cap, HV, V], g [B, cap, HV, K] with
    count[b] committed entries; drafts: dict q, k [B, T, H, K], v [B, T, HV, V], g [B, T, HV, K], beta [B, T, HV];
    width [B] drafts used per sequence. Returns the drafts' u and outputs, [B, T, HV, V] each.
    """
    src_hi = src_hi.float().contiguous()
    if packed is None:
        read_hi = torch.ones_like(read_hi)
    bsz, nw, nv, dv = drafts["v"].shape
    dk = drafts["k"].shape[-1]
    cap = buffer["k"].shape[1]
    kind, group, data, scales, gs, kp = read_args(packed, read_fmt, src_hi)
    u = torch.zeros(bsz, nw, nv, dv, device=src_hi.device)
    o = torch.zeros_like(u)
    bv = min(max(16, triton.next_power_of_2(dv)), 64)
    _verify_kernel[(bsz, nv, triton.cdiv(dv, bv))](
        *(drafts[name].float().contiguous() for name in ("q", "k", "v", "g", "beta")),
        width.contiguous(), buffer["k"].contiguous(), buffer["u"].contiguous(), buffer["g"].contiguous(), count.contiguous(),
        read_hi.to(torch.int32).contiguous(), src_hi, data, scales, gs, u, o,
        nv, groups, dk, dv, kp, cap, float(eps or 0.0),
        W=nw, CP=max(16, triton.next_power_of_2(cap)), BK=max(16, triton.next_power_of_2(dk)), BV=bv,
        KIND=kind, GROUP=group, SKIP=eps is not None, num_warps=4,
    )
    return u, o


@triton.jit
def _conventional_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, o_ptr,  # q, k [B, H, K]; v, o [B, HV, V]; g [B, HV, K]; beta [B, HV]
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
    s = tl.exp(tl.load(g_ptr + bh * K + ks, mask=kmask, other=0.0))[None, :] * s
    u = tl.load(beta_ptr + bh) * (v - tl.sum(s * k[None, :], axis=1))
    s = s + u[:, None] * k[None, :]
    tl.store(s_ptr + s_off, s, mask=mask)
    tl.store(o_ptr + bh * V + vs, tl.sum(s * q[None, :], axis=1), mask=vmask)


def conventional_step(q, k, v, g, beta, state, *, block_v=16, num_warps=4):
    """Conventional eager decoding of one token with an FP32 state (fused recurrent KDA step), the baseline the
    benchmarks compare ReplaySSM with: read the state, update it, write it back in place.

    q, k [B, H, K]; v [B, HV, V]; g [B, HV, K]; beta [B, HV]; state [B, HV, V, K] (the stored layout, as
    ReplayState.hi); all FP32 and contiguous. Returns o [B, HV, V]; `state` holds S_t afterwards.
    """
    return conventional_launch(_conventional_step_kernel, q, k, v, g, beta, state, block_v, num_warps)

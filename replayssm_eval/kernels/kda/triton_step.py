"""Triton decode kernels of ReplaySSM Kimi Delta Attention (FP32 math).

Layering, tiling and what the delta-rule families share: as in `triton_chunk`'s docstring (one program per
(sequence, value head, block of value columns); stored copies [B, HV, V, K]).

1. `launch_replay_step` (`kda.decode_step_triton`, and the fixed-buffer step, `delta.fixed_step`):
   one decode token for B sequences at their own phases, in two steps. `_head_terms_kernel`, once per (sequence,
   value head): the per-channel decays d = exp(g_{0..j}) and a_i = exp(g_{i+1..j}) over the buffer, the decayed token
   vectors d k_j, d q_j, the buffer weights a_i (k_j . k_i), a_i (q_j . k_i) and, for an open fold, the decayed keys
   a_i k_i (`head_terms`: a small workspace). Then per (sequence, value head, block of BLOCK_V stored rows) the rows
   only stream: for the sequences that do not fold `_replay_step_kernel` (the row dots S_src^T (d k_j), S_src^T (d q_j)
   of the read copy decoded in registers, `delta.triton_step.rowdots`, and the buffer's u rows), for those that fold
   `_replay_fold_kernel` (the same row dots, S_hi's where the row reads it, and the FP32 fold: open, d S_hi plus the
   buffered u rows times their decayed keys as one product, BLOCK_K columns at a time, since a column's fold needs
   only that column; closed, the whole S_hi rows and the delta rule re-run over the buffered raw entries), which the
   host rounds to both copies. A head's terms computed once, not in each of its programs, leave the rows a stream
   (BENCHMARKS.md, Decode step). A reading launch whose programs each hold a whole head (TERMS) computes its
   head's terms itself, before its rows, and the terms launch then computes the folding rows' only (none where no
   row folds). `step_launch_config` and `fold_launch_config` give the block sizes (benchmarks/kernel_speed.py
   sweeps them).
2. `verify_triton`: output-only speculative verification of T drafts per sequence from a
   checkpoint copy and the committed buffer (drafts' u by forward substitution), no state write;
   `kda.verify` is it in the `KernelFamily` call convention.
3. `conventional_step`: the conventional FP32 eager step, the benchmarks' baseline.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.device import NVFP4
from replayssm_eval.kernels.dependent_launch import dependent_launches, release_dependents, wait_for_prior_launch
from replayssm_eval.kernels.delta.triton_step import conventional_launch, load_packed, read_args, rowdots
from replayssm_eval.kernels.step_variants import other_launch_row, read_hi_flags, row_reads_hi, step_launches
from replayssm_eval.kernels.tile_dot import dot  # a jit helper the kernels read as a global
from replayssm_eval.replay.buffer_round import round_buffered


@triton.jit
def _head_row(terms_ptr, bh, K: tl.constexpr, BLOCK_E: tl.constexpr):
    """The head's row of the terms (`head_terms`): d k [K], d q [K], d [K], the weights [BLOCK_E] x 2, q . k, keep,
    two words of padding (rows of a multiple of 16 bytes where 4 divides K: d k and d q load as 16-byte vectors)."""
    return terms_ptr + bh * (3 * K + 2 * BLOCK_E + 4)


@triton.jit
def _store_head_terms(q_ptr, k_ptr, g_ptr, bk_ptr, bg_ptr, count_ptr, fold_ptr, terms_ptr, keys_ptr, b, hv, HV,
                      GROUPS, CAP, eps, K: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr, SKIP: tl.constexpr,
                      KEYS: tl.constexpr):
    """Store the terms of head hv of sequence b (`head_terms`), and with KEYS, where the row folds, its decayed
    buffer keys a_i k_i (an open fold's buffer sum). Pointers as `_head_terms_kernel`'s."""
    h = hv // GROUPS
    H = HV // GROUPS
    bh = b.to(tl.int64) * HV + hv
    tok = (b.to(tl.int64) * H + h) * K
    ks = tl.arange(0, BK)
    kmask = ks < K
    kj = tl.load(k_ptr + tok + ks, mask=kmask, other=0.0)  # [BK]
    qj = tl.load(q_ptr + tok + ks, mask=kmask, other=0.0)
    count = tl.load(count_ptr + b)
    t = _head_row(terms_ptr, bh, K, BLOCK_E)
    # the entries from the last to the first, each channel's log decays summed in order by the thread holding it:
    # g_run = g_{i+1..j} (the token's and the later entries'), a_i = exp(g_run); a_i = 0 past the count. The loop
    # only loads: its results are stored after it, so the entries' loads are not held behind stores that might alias.
    g_run = tl.load(g_ptr + bh * K + ks, mask=kmask, other=0.0)  # [BK]
    offs_e = tl.arange(0, BLOCK_E)
    wk = tl.zeros([BLOCK_E], tl.float32)  # a_i (k_j . k_i)
    wq = tl.zeros([BLOCK_E], tl.float32)  # a_i (q_j . k_i)
    if KEYS:  # an open fold's buffer sum takes the decayed keys a_i k_i
        keys = tl.zeros([BLOCK_E, BK], tl.float32)
    for n in tl.static_range(BLOCK_E):
        i = BLOCK_E - 1 - n
        m = kmask & (i < count)
        ent = b.to(tl.int64) * CAP + i
        ak = tl.where(m, tl.load(bk_ptr + (ent * H + h) * K + ks, mask=m, other=0.0) * tl.exp(g_run), 0.0)  # a_i k_i
        wk = tl.where(offs_e == i, tl.sum(ak * kj, axis=0), wk)
        wq = tl.where(offs_e == i, tl.sum(ak * qj, axis=0), wq)
        if KEYS:
            keys = tl.where(offs_e[:, None] == i, ak[None, :], keys)
        g_run += tl.load(bg_ptr + (ent * HV + hv) * K + ks, mask=m, other=0.0)
    tl.store(t + 3 * K + offs_e, wk)
    tl.store(t + 3 * K + BLOCK_E + offs_e, wq)
    if KEYS:  # of the rows that fold
        keys_mask = kmask & (tl.load(fold_ptr + b) != 0)
        tl.store(keys_ptr + (bh * BLOCK_E + offs_e[:, None]) * K + ks[None, :], keys, mask=keys_mask[None, :])
    keep = 1.0  # g_run is now g_{0..j}, checkpoint -> token
    if SKIP:  # the checkpoint term is zeroed where its slowest channel decayed below eps
        keep = tl.where(tl.exp(tl.max(tl.where(kmask, g_run, -float("inf")), axis=0)) >= eps, 1.0, 0.0)
    d = tl.where(kmask, keep * tl.exp(g_run), 0.0)  # [BK]
    tl.store(t + ks, d * kj, mask=kmask)
    tl.store(t + K + ks, d * qj, mask=kmask)
    tl.store(t + 2 * K + ks, d, mask=kmask)
    tl.store(t + 3 * K + 2 * BLOCK_E, tl.sum(qj * kj, axis=0))
    tl.store(t + 3 * K + 2 * BLOCK_E + 1, keep)


@triton.jit
def _head_terms_kernel(
    q_ptr, k_ptr, g_ptr,  # the token: q, k [B, H, K]; g [B, HV, K]
    bk_ptr, bg_ptr,  # buffer k [B, CAP, H, K]; g [B, CAP, HV, K]
    count_ptr, fold_ptr,  # [B] committed entries; [B] int8 fold after the token
    terms_ptr, keys_ptr,  # terms [B, HV, TERMS] (`head_terms`); keys [B, HV, BLOCK_E, K] the decayed buffer keys
    HV, GROUPS, CAP, eps,
    K: tl.constexpr, BK: tl.constexpr, BLOCK_E: tl.constexpr, SKIP: tl.constexpr, KEYS: tl.constexpr,
    FOLDING: tl.constexpr, PDL: tl.constexpr,
):
    """The head's terms (`_store_head_terms`) of every row, or with FOLDING of the rows that fold only (the reading
    launch computes its rows' own: `_replay_step_kernel` with TERMS)."""
    release_dependents(PDL)  # the step's row launches may start; they wait for these terms
    b = tl.program_id(0)
    if other_launch_row(fold_ptr, b, True, FOLDING):
        return
    _store_head_terms(q_ptr, k_ptr, g_ptr, bk_ptr, bg_ptr, count_ptr, fold_ptr, terms_ptr, keys_ptr, b,
                      tl.program_id(1), HV, GROUPS, CAP, eps, K, BK, BLOCK_E, SKIP, KEYS)


@triton.jit
def _buffer_terms(terms_ptr, bu_ptr, v_ptr, beta_ptr, count, b, bh, hv, offs_v, mask_v, sk, sq, CAP, HV,
                  K: tl.constexpr, V: tl.constexpr, BLOCK_E: tl.constexpr):
    """The token's u and o [BLOCK_V] of the rows offs_v from the row dots sk = S_src^T (d k), sq = S_src^T (d q), the
    head's buffer weights (`head_terms`) and the buffered u rows; and the buffered rows [BLOCK_E, BLOCK_V]."""
    t = _head_row(terms_ptr, bh, K, BLOCK_E)
    offs_e = tl.arange(0, BLOCK_E)
    mask_e = offs_e < count
    ent = b.to(tl.int64) * CAP + offs_e
    bu = tl.load(bu_ptr + (ent[:, None] * HV + hv) * V + offs_v[None, :], mask=mask_e[:, None] & mask_v[None, :],
                 other=0.0)  # [BLOCK_E, BLOCK_V]
    wk = tl.load(t + 3 * K + offs_e)
    wq = tl.load(t + 3 * K + BLOCK_E + offs_e)
    vj = tl.load(v_ptr + bh * V + offs_v, mask=mask_v, other=0.0)
    u = tl.load(beta_ptr + bh) * (vj - sk - tl.sum(bu * wk[:, None], axis=0))
    o = sq + tl.sum(bu * wq[:, None], axis=0) + tl.load(t + 3 * K + 2 * BLOCK_E) * u
    return u, o, bu


@triton.jit
def _replay_step_kernel(
    q_ptr, k_ptr, g_ptr, v_ptr, beta_ptr,  # the token: q, k [B, H, K]; g [B, HV, K]; v [B, HV, V]; beta [B, HV]
    bk_ptr, bg_ptr, bu_ptr, count_ptr,  # buffer k [B, CAP, H, K], g [B, CAP, HV, K], u [B, CAP, HV, V]; [B] entries
    rhi_ptr, fold_ptr,  # [B] int8: read S_hi instead of the read copy; fold after the token
    hi_ptr, data_ptr, scale_ptr, gs_ptr,  # S_hi [B, HV, V, K] FP32 and the packed read copy
    terms_ptr, u_ptr, o_ptr,  # terms [B, HV, TERMS] (`head_terms`); u, o [B, HV, V]
    HV, GROUPS, CAP, eps,
    K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr, KIND: tl.constexpr, GROUP: tl.constexpr,
    SKIP: tl.constexpr, SPLIT: tl.constexpr, HI_AT_FOLD: tl.constexpr, WORDS: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, TERMS: tl.constexpr, PDL: tl.constexpr,
):
    """The rows of a step that do not fold (`launch_replay_step`). TERMS: one program a head (BLOCK_V >= V) that
    computes its head's terms itself (`_store_head_terms`) instead of reading those of `_head_terms_kernel`; the token
    and the buffer's k and g are read only then."""
    wait_for_prior_launch(PDL)  # every program, those that return at once too: the next launch waits on this one
    release_dependents(PDL)
    b = tl.program_id(0)
    if other_launch_row(fold_ptr, b, False, SPLIT):  # SPLIT: the rows that do not fold only (`_replay_fold_kernel`)
        return
    hv = tl.program_id(1)
    if TERMS:
        _store_head_terms(q_ptr, k_ptr, g_ptr, bk_ptr, bg_ptr, count_ptr, fold_ptr, terms_ptr, terms_ptr, b, hv, HV,
                          GROUPS, CAP, eps, K, BK, BLOCK_E, SKIP, False)
        tl.debug_barrier()  # every thread's terms stored before any thread loads them
    bh = b.to(tl.int64) * HV + hv
    offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < V
    rows = bh * V + offs_v  # [BLOCK_V] state row of [B, HV, V]
    t = _head_row(terms_ptr, bh, K, BLOCK_E)
    do_read = True
    if SKIP:
        do_read = tl.load(t + 3 * K + 2 * BLOCK_E + 1) != 0.0  # the checkpoint term is zeroed: skip its read
    read_hi = row_reads_hi(rhi_ptr, b, False, HI_AT_FOLD)
    sk = tl.zeros([BLOCK_V], dtype=tl.float32)
    sq = tl.zeros([BLOCK_V], dtype=tl.float32)
    if do_read:
        sk, sq = rowdots(hi_ptr, data_ptr, scale_ptr, gs_ptr, t, t + K, b, bh, rows, mask_v,
                         read_hi, K, KP, KIND, GROUP, BLOCK_V, BLOCK_K, WORDS)
    u, o, _ = _buffer_terms(terms_ptr, bu_ptr, v_ptr, beta_ptr, tl.load(count_ptr + b), b, bh, hv, offs_v, mask_v,
                            sk, sq, CAP, HV, K, V, BLOCK_E)
    tl.store(u_ptr + rows, u, mask=mask_v)
    tl.store(o_ptr + rows, o, mask=mask_v)


@triton.jit
def _replay_fold_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,  # the token: q, k [B, H, K]; v [B, HV, V]; g [B, HV, K]; beta [B, HV]
    bk_ptr, bu_ptr, bg_ptr, bv_ptr, bbeta_ptr,  # buffer k [B, CAP, H, K]; u, v [B, CAP, HV, V]; g [B, CAP, HV, K]; beta [B, CAP, HV]
    count_ptr,  # [B] committed entries
    rhi_ptr, fold_ptr,  # [B] int8: read S_hi instead of the read copy; fold after the token
    hi_ptr, data_ptr, scale_ptr, gs_ptr,  # S_hi [B, HV, V, K] FP32 and the packed read copy
    terms_ptr, keys_ptr,  # terms [B, HV, TERMS], keys [B, HV, BLOCK_E, K] (`head_terms`)
    u_ptr, o_ptr, out_ptr,  # u, o [B, HV, V]; out [B, HV, V, K] the FP32 fold
    HV, GROUPS, CAP,
    K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr, KIND: tl.constexpr, GROUP: tl.constexpr,
    CLOSED: tl.constexpr, SHARED: tl.constexpr, BUF: tl.constexpr, SPLIT: tl.constexpr, HI_AT_FOLD: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_prior_launch(PDL)
    b = tl.program_id(0)
    if other_launch_row(fold_ptr, b, True, SPLIT):  # SPLIT: the folding rows only (`_replay_step_kernel` the others)
        return
    hv = tl.program_id(1)
    h = hv // GROUPS
    H = HV // GROUPS
    bh = b.to(tl.int64) * HV + hv
    tok = (b.to(tl.int64) * H + h) * K
    offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < V
    rows = bh * V + offs_v  # [BLOCK_V] state row of [B, HV, V]
    ks = tl.arange(0, BK)
    kmask = ks < K
    m2 = mask_v[:, None] & kmask[None, :]
    t = _head_row(terms_ptr, bh, K, BLOCK_E)
    read_hi = row_reads_hi(rhi_ptr, b, True, HI_AT_FOLD)
    if CLOSED:  # the whole FP32 S_hi block, read once for the row dots (where read) and the fold
        s_hi = tl.load(hi_ptr + rows[:, None] * K + ks[None, :], mask=m2, other=0.0)  # [BLOCK_V, BK] rows of S_hi^T
        if read_hi | SHARED:  # shared: the read copy holds S_hi's values
            sk = tl.sum(s_hi * tl.load(t + ks, mask=kmask, other=0.0)[None, :], axis=1)
            sq = tl.sum(s_hi * tl.load(t + K + ks, mask=kmask, other=0.0)[None, :], axis=1)
        else:
            sk, sq = rowdots(hi_ptr, data_ptr, scale_ptr, gs_ptr, t, t + K, b, bh, rows, mask_v, read_hi,
                             K, KP, KIND, GROUP, BLOCK_V, BLOCK_K, True)
    else:  # open: the row dots as a reading step takes them (shared: S_hi's values), the fold column by column
        sk, sq = rowdots(hi_ptr, data_ptr, scale_ptr, gs_ptr, t, t + K, b, bh, rows, mask_v, read_hi | SHARED,
                         K, KP, KIND, GROUP, BLOCK_V, BLOCK_K, True)
    count = tl.load(count_ptr + b)
    u, o, bu = _buffer_terms(terms_ptr, bu_ptr, v_ptr, beta_ptr, count, b, bh, hv, offs_v, mask_v, sk, sq, CAP, HV,
                             K, V, BLOCK_E)
    if CLOSED:  # the delta rule re-run over the buffered raw entries
        kj = tl.load(k_ptr + tok + ks, mask=kmask, other=0.0)  # [BK]
        s = tl.load(t + 3 * K + 2 * BLOCK_E + 1) * s_hi
        i = 0
        while i < count:  # a while loop: the interpreter cannot take range() of a runtime scalar
            r = b.to(tl.int64) * CAP + i
            k_i = tl.load(bk_ptr + (r * H + h) * K + ks, mask=kmask, other=0.0)
            s = tl.exp(tl.load(bg_ptr + (r * HV + hv) * K + ks, mask=kmask, other=0.0))[None, :] * s
            v_i = tl.load(bv_ptr + (r * HV + hv) * V + offs_v, mask=mask_v, other=0.0)
            u_i = tl.load(bbeta_ptr + r * HV + hv) * (v_i - tl.sum(s * k_i[None, :], axis=1))
            s += u_i[:, None] * k_i[None, :]
            i += 1
        s = tl.exp(tl.load(g_ptr + bh * K + ks, mask=kmask, other=0.0))[None, :] * s
        vj = tl.load(v_ptr + bh * V + offs_v, mask=mask_v, other=0.0)
        s += (tl.load(beta_ptr + bh) * (vj - tl.sum(s * kj[None, :], axis=1)))[:, None] * kj[None, :]
        if read_hi:  # the fold token's output comes from the closed-fold state
            o = tl.sum(s * tl.load(q_ptr + tok + ks, mask=kmask, other=0.0)[None, :], axis=1)
        tl.store(out_ptr + rows[:, None] * K + ks[None, :], s, mask=m2)
    else:
        # d S_hi + sum_i u_i (a_i k_i)^T + u_j k_j^T, the token's u as buffered (rounded to the buffer dtype), BLOCK_K
        # columns at a time: a column's fold needs only that column, so no whole [BLOCK_V, K] block is live at once;
        # STAGES > 1 loads the next passes' columns while this one folds (Triton's software pipeline)
        ub = round_buffered(u, BUF)
        for c in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            kc = c + tl.arange(0, BLOCK_K)
            mc = kc < K
            mask_c = mask_v[:, None] & mc[None, :]
            s_hi = tl.load(hi_ptr + rows[:, None] * K + kc[None, :], mask=mask_c, other=0.0)  # [BLOCK_V, BLOCK_K]
            keys = tl.load(keys_ptr + (bh * BLOCK_E + tl.arange(0, BLOCK_E)[:, None]) * K + kc[None, :],
                           mask=mc[None, :], other=0.0)  # [BLOCK_E, BLOCK_K] (zero past count)
            s = tl.load(t + 2 * K + kc, mask=mc, other=0.0)[None, :] * s_hi + dot(tl.trans(bu), keys, "ieee") \
                + ub[:, None] * tl.load(k_ptr + tok + kc, mask=mc, other=0.0)[None, :]
            tl.store(out_ptr + rows[:, None] * K + kc[None, :], s, mask=mask_c)
    tl.store(u_ptr + rows, u, mask=mask_v)
    tl.store(o_ptr + rows, o, mask=mask_v)


def head_terms(batch: int, heads: int, dk: int, block_e: int, device) -> torch.Tensor:
    """The per-head terms of a step, [B, HV, 3 K + 2 BLOCK_E + 4] FP32 (two words of padding: `_head_row`), written by
    `_head_terms_kernel` once per (sequence, value head) and read by every program of the head: d k_j, d q_j, d ([K]
    each; d = exp(g_{0..j}), 0 where skip_read_below zeroes the checkpoint term), the buffer weights a_i (k_j . k_i),
    a_i (q_j . k_i) ([BLOCK_E] each), q_j . k_j and keep (1, or 0 where the checkpoint term is skipped)."""
    return torch.empty(batch, heads, 3 * dk + 2 * block_e + 4, device=device)


def step_launch_config(batch: int, heads: int, dk: int, dv: int, kind: int) -> dict:
    """BLOCK_V (state rows per program), BLOCK_K (columns per pass, a multiple of 16), WORDS (how NVFP4 codes load,
    `rowdots`), TERMS (whole heads computing their terms: BLOCK_V >= dv), num_warps and maxnreg of
    `_replay_step_kernel`, whose programs stream their rows after the head's terms (`_head_terms_kernel`'s, or with
    TERMS their own).
    Many sequences: the sweeps' best at K = V = 128, batch 256 (BENCHMARKS.md, Decode step;
    benchmarks/kernel_speed.py sweeps them): the FP32 read in two-warp tiles of 64 rows; the NVFP4 read row-wise
    (WORDS=2: a row's codes summed by the thread holding it), a whole head in one warp computing its terms (0.098 ms
    against 0.103 for two rows a thread after the terms launch on an H100; heads of more than 128 channels or rows,
    untimed, take the latter); few: programs of 16 rows, more of them."""
    block_k = min(128, max(16, triton.next_power_of_2(dk)))
    if batch * heads < 4096:
        return {"BLOCK_V": 16, "BLOCK_K": block_k, "WORDS": True, "TERMS": False, "num_warps": 2, "maxnreg": None}
    if kind == NVFP4:
        whole = max(dk, dv) <= 128
        return {"BLOCK_V": max(16, triton.next_power_of_2(dv)) if whole else 64, "BLOCK_K": min(block_k, 32),
                "WORDS": 2, "TERMS": whole, "num_warps": 1, "maxnreg": None}
    return {"BLOCK_V": 64, "BLOCK_K": min(block_k, 64), "WORDS": True, "TERMS": False, "num_warps": 2, "maxnreg": None}


def fold_launch_config(batch: int, heads: int, dv: int) -> dict:
    """BLOCK_V (state rows per program: at least 16, the rows of the buffer sum's tl.dot), BLOCK_K (the columns of a
    pass over K: the read copy's row dots, the open fold's columns), STAGES (the open fold's passes in flight) and
    num_warps of `_replay_fold_kernel`. Many sequences: the H100 sweep's best at K = V = 128, batch 256 for both read
    copies (0.64 ms against 0.78 for v32 k32 one pass at a time, BENCHMARKS.md, Decode step); fewer: not timed."""
    if batch * heads >= 4096:
        return {"BLOCK_V": 64, "BLOCK_K": 64, "STAGES": 3, "num_warps": 4}
    return {"BLOCK_V": 16, "BLOCK_K": 32, "STAGES": 2, "num_warps": 4}


def step_grid(batch: int, heads: int, dv: int, block_v: int) -> tuple[int, int, int]:
    return batch, heads, triton.cdiv(dv, block_v)


def launch_replay_step(hi, packed, read_fmt, buffer, count, new, read_hi, fold, u, o, out, *, folds, closed, shared,
                       groups, eps, buf_kind):
    """Launch `_head_terms_kernel` for every row (for the folding rows only, or not at all where none folds, when the
    reading launch computes its rows' terms: TERMS), then `_replay_step_kernel` for the rows that do not fold and
    `_replay_fold_kernel` for those that do: one token per sequence after count[b] committed buffer entries, into the
    given tensors and a workspace of the head's terms (`head_terms`), with no host sync (the launch of the eager step,
    `delta.triton_step.decode_step`, and of the static step, `kernels.static_step`). On sm_90 and later the row
    launches are dependent launches (`dependent_launch`): their programs start while the terms are computed and wait
    for them.
    folds: the step variant, "none", "some" or "all" rows fold (`step_variants.FOLDS`); "some" launches both step
    kernels, each skipping the other's rows (`step_variants.step_launches`), so a row's output never depends on whether
    other rows fold at this token.

    hi: S_hi [B, HV, V, K] FP32 (read where read_hi[b] or fold[b]); packed: the read copy, in read_fmt; buffer: k
    [B, CAP, H, K], u (v) [B, CAP, HV, V], g [B, CAP, HV, K] (beta [B, CAP, HV]; v, beta: closed only); count [B]
    int64; new: q, k [B, H, K], v [B, HV, V], g [B, HV, K], beta [B, HV] (FP32); read_hi [B] int8, or None where rows
    read S_hi exactly where they fold (a fixed window, `step_variants.read_hi_flags`); fold [B] int8 (fold after the
    token). Writes u (as computed) and o [B, HV, V] FP32, and unless folds is "none" the FP32 fold of
    the folding rows into out [B, HV, V, K], which may be hi itself (a program reads its rows of S_hi before writing
    them). buf_kind: `buffer_round.buffer_kind` of the config (an open fold takes the token's u rounded to it).
    shared: one stored copy (the read copy holds S_hi's values), so a folding row takes its row dots from the S_hi
    block it loads for the fold instead of reading the read copy too.
    """
    bsz, nv, dv = new["v"].shape
    dk = new["k"].shape[-1]
    cap = buffer["k"].shape[1]
    kind, group, data, scales, gs, kp = read_args(packed, read_fmt, hi)
    q, k, v, g, beta = (new[name].contiguous() for name in ("q", "k", "v", "g", "beta"))
    block_e = max(16, triton.next_power_of_2(cap))
    bk = max(16, triton.next_power_of_2(dk))
    fold, count = fold.contiguous(), count.contiguous()
    read_hi, hi_at_fold = read_hi_flags(read_hi, fold)
    entries = {name: buffer.get(name, buffer["g"]).contiguous() for name in ("k", "u", "g", "v", "beta")}
    terms = head_terms(bsz, nv, dk, block_e, hi.device)
    open_fold = folds != "none" and not closed
    keys = torch.empty(bsz, nv, block_e, dk, device=hi.device) if open_fold else terms  # [B, HV, BLOCK_E, K]
    pdl = dependent_launches(hi.device)  # the row launches start while the head's terms are computed
    read_cfg = step_launch_config(bsz, nv, dk, dv, kind)
    if read_cfg["TERMS"] and read_cfg["BLOCK_V"] < dv:
        raise ValueError(f"a reading launch with TERMS holds a whole head: BLOCK_V {read_cfg['BLOCK_V']} < V {dv}")
    # one warp a head: its channels' sums over the entries in registers, the entries' dot products by shuffles; where
    # the reading launch computes its rows' terms itself (TERMS), of the folding rows only
    own_terms = read_cfg["TERMS"]
    if not (own_terms and folds == "none"):
        _head_terms_kernel[(bsz, nv)](
            q, k, g, entries["k"], entries["g"], count, fold, terms, keys, nv, groups, cap, float(eps or 0.0),
            K=dk, BK=bk, BLOCK_E=block_e, SKIP=eps is not None, KEYS=open_fold, FOLDING=own_terms, PDL=pdl,
            num_warps=1,
        )
    for fold_path, split in step_launches(folds):
        if fold_path:
            cfg = fold_launch_config(bsz, nv, dv)
            _replay_fold_kernel[step_grid(bsz, nv, dv, cfg["BLOCK_V"])](
                q, k, v, g, beta, *(entries[name] for name in ("k", "u", "g", "v", "beta")), count, read_hi, fold,
                hi, data, scales, gs, terms, keys, u, o, out, nv, groups, cap,
                K=dk, V=dv, KP=kp, BK=bk, KIND=kind, GROUP=group, CLOSED=closed, SHARED=shared, BUF=buf_kind,
                SPLIT=split, HI_AT_FOLD=hi_at_fold, BLOCK_E=block_e, PDL=pdl, launch_pdl=pdl, **cfg,
            )
        else:
            _replay_step_kernel[step_grid(bsz, nv, dv, read_cfg["BLOCK_V"])](
                q, k, g, v, beta, entries["k"], entries["g"], entries["u"], count, read_hi, fold, hi, data, scales, gs,
                terms, u, o, nv, groups, cap, float(eps or 0.0),
                K=dk, V=dv, KP=kp, BK=bk, KIND=kind, GROUP=group, SKIP=eps is not None, SPLIT=split,
                HI_AT_FOLD=hi_at_fold, BLOCK_E=block_e, PDL=pdl, launch_pdl=pdl, **read_cfg,
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

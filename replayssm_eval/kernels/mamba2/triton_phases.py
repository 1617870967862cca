"""Mamba-2's chunked scan in phases, for a read copy with a head scale along d_state: the fold chain alone, then
every segment's outputs at once.

The one-loop kernel (`triton_chunk`) runs a head in programs of 16 head_dim rows, and the head's amax of a read copy
is known only once all of them have folded. Only the folds are sequential (each flush's rounding feeds the next
window), and a segment's outputs need the copies at its start and its own inputs only. So, per block of segments:

1. `_fold_chain_kernel`, one program per (d_state tile, head_dim tile, head, sequence), walks the block's segments
   and folds its tile: pre-image g_seg S_hi + sum_i dt_i G_{i+1..L-1} x_i B_i^T, S_hi rounded from it in the tile
   (the recurrence copy's groups lie in one tile: elementwise kinds take tiles of CHUNK_COLUMNS columns, a row of
   d_state the whole row), kept in registers from fold to fold. It stores every fold's S_hi and pre-image in the block's
   slots (slot 0: the copies at the block's start) and each tile's amax of each fold.
2. `_round_slots_kernel`, one program per (head_dim tile, slot, head, sequence), rounds each slot's pre-image to the
   read copy in place with the head's amax of its fold (before the call's first fold: the S_lo given).
3. `_segment_outputs_kernel`, one program per (head_dim tile, segment, head, sequence), reads the copies at its
   segment's start from the slots and computes the segment's outputs as `triton_chunk`'s loop does
   (`segment_output`, the code both run).

The folds, their roundings (same tiles, keys and counters) and so S_hi are `triton_chunk`'s bits; the read copy is
the same rounding of the same pre-image, so the same bits; the outputs are the same code's. The call's last S_lo is
rounded by torch from the last pre-image with the packed read copy (`write_read_copy_packed`), as for a read copy
rounded outside the kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import Group, KernelCodec
from replayssm_eval.formats.device import (
    RESIDUAL_NONE, feedback_residual, feedback_target, quantize_tile, round_state_tile, state_bits, tile_amax,
)
from replayssm_eval.kernels.tile_dot import add_dot, dot, dot_acc, window_rows
from replayssm_eval.replay.buffer_round import BUF_FP32, buffer_kind, round_buffered

# shared with `triton_chunk`'s one loop, whose tiles and output code these phases repeat bit for bit
PROGRAM_ROWS = 16  # head_dim rows per program where no scale group spans more rows
CHUNK_COLUMNS = 32  # d_state columns per product of a segment's reads, and of a fold program where S_hi is elementwise
_SLOT_ELEMENTS = 1 << 26  # elements of one slot array a block holds: batch * (segments + 1) * H * P * N (256 MiB)


@triton.jit
def fold_weights(dt, cs, skip, SKIP: tl.constexpr, BLOCK_L: tl.constexpr):
    """A window's fold g_seg S + sum_i w_i x_i B_i^T: g_seg = G_{0..L-1} (0 below skip) and w_i = dt_i G_{i+1..L-1}
    [BLOCK_L] from dt and log G_{0..j} (cs)."""
    cs_last = tl.sum(tl.where(tl.arange(0, BLOCK_L) == BLOCK_L - 1, cs, 0.0), axis=0)  # padding has dt = 0
    g_seg = tl.exp(cs_last)
    if SKIP:
        g_seg = tl.where(g_seg < skip, 0.0, g_seg)
    if BLOCK_L == 1:  # one token: w = dt (no decay after it); the GPU compiler turned cs_last - cs, with cs the bare
        w = dt        # product dt A, into an FMA whose residual moved exp(0) off 1
    else:
        w = tl.exp(cs_last - cs) * dt
    return g_seg, w


@triton.jit
def _fold_chain_kernel(
    x_ptr, b_ptr, dt_ptr, fold_ptr,  # the padded segment grid: [B, S, L, H, P], [B, S, L, G, N], [B, S, L, H], [B, S]
    A_ptr, hi_ptr, pre_ptr, ck_ptr, key_ptr,  # [H]; S_hi and the newest pre-image [B, H, P, N] (carried); [B]; [B, 2]
    res_ptr,  # RECUR_EF: S_hi's error-feedback residual [B, H, P, N], in place
    hi_slots_ptr, pre_slots_ptr, amax_ptr,  # [B, K + 1, H, P, N] x2; [B, K, H, TILES] each tile's amax of each fold
    S, S0, S1, L, H, P, N, G, HPG, TILES, skip,  # this launch folds segments [S0, S1) = K of the S in the grid
    RECUR: tl.constexpr, RECUR_GROUP: tl.constexpr, RECUR_MAX: tl.constexpr, RECUR_ORDER: tl.constexpr,
    RECUR_RANDOM: tl.constexpr, RECUR_ROWS: tl.constexpr, RECUR_COLS: tl.constexpr, RECUR_AXIS: tl.constexpr,
    RECUR_ROT: tl.constexpr, RECUR_EF: tl.constexpr, READ_ORDER: tl.constexpr,
    SKIP: tl.constexpr, BUF: tl.constexpr, DOT: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    tile_n, tile_p, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    g = h // HPG
    offs_l = tl.arange(0, BLOCK_L)
    offs_p = tile_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_l, mask_p, mask_n = offs_l < L, offs_p < P, offs_n < N
    mask_s = mask_p[:, None] & mask_n[None, :]
    elem = (h * P + offs_p[:, None]).to(tl.int64) * N + offs_n[None, :]  # [BLOCK_P, BLOCK_N] index in [H, P, N]
    state_off = b.to(tl.int64) * H * P * N + elem
    slot_off = b.to(tl.int64) * (S1 - S0 + 1) * H * P * N + elem  # slot 0 of this sequence; slot k: + k * H * P * N
    A = tl.load(A_ptr + h)
    ck = tl.load(ck_ptr + b)
    key_hi = tl.load(key_ptr + 2 * b)
    hi = tl.load(hi_ptr + state_off, mask=mask_s, other=0.0)  # padding zero: it never raises an amax
    pre = tl.load(pre_ptr + state_off, mask=mask_s, other=0.0)
    tl.store(hi_slots_ptr + slot_off, hi, mask=mask_s)
    tl.store(pre_slots_ptr + slot_off, pre, mask=mask_s)
    e = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)  # S_hi's error-feedback residual, zero without
    if RECUR_EF != RESIDUAL_NONE:
        e = tl.load(res_ptr + state_off, mask=mask_s, other=0.0)
    s = S0
    while s < S1:  # a while loop: the interpreter cannot take range() of a runtime scalar
        if tl.load(fold_ptr + b * S + s) != 0:
            row = (b * S + s).to(tl.int64) * L + offs_l  # [BLOCK_L] entry index in the grid
            dt = tl.load(dt_ptr + row * H + h, mask=mask_l, other=0.0)
            g_seg, w = fold_weights(dt, tl.cumsum(dt * A, axis=0), skip, SKIP, BLOCK_L)
            x = tl.load(x_ptr + (row[:, None] * H + h) * P + offs_p[None, :],
                        mask=mask_l[:, None] & mask_p[None, :], other=0.0)  # [BLOCK_L, BLOCK_P]
            keys = tl.load(b_ptr + (row[:, None] * G + g) * N + offs_n[None, :],
                           mask=mask_l[:, None] & mask_n[None, :], other=0.0)  # [BLOCK_L, BLOCK_N]
            if BUF == BUF_FP32:
                xt = tl.trans(x * w[:, None])  # [BLOCK_P, BLOCK_L]
            else:  # the scaled keys dt_i G_{i+1..L-1} B_i in the buffer dtype before the dot, as vLLM's fold
                xt = tl.trans(x)
                keys = round_buffered(keys * w[:, None], BUF)
            pre = add_dot(g_seg * hi, xt, keys, DOT)
            counter = ((ck + s + 1) << 32) + elem
            target = feedback_target(pre, e, RECUR_EF)
            hi = round_state_tile(target, state_bits(key_hi, counter, offs_n[None, :], RECUR, RECUR_RANDOM), RECUR,
                                  RECUR_GROUP, RECUR_MAX, RECUR_ORDER, RECUR_ROWS, RECUR_COLS, RECUR_AXIS, RECUR_ROT,
                                  BLOCK_P, BLOCK_N)
            if RECUR_EF != RESIDUAL_NONE:
                e = feedback_residual(target, hi, RECUR_EF)
            slot = slot_off + (s - S0 + 1).to(tl.int64) * H * P * N
            tl.store(hi_slots_ptr + slot, hi, mask=mask_s)
            tl.store(pre_slots_ptr + slot, pre, mask=mask_s)
            at = ((b * (S1 - S0) + s - S0).to(tl.int64) * H + h) * TILES + tile_p * tl.num_programs(0) + tile_n
            tl.store(amax_ptr + at + tl.arange(0, 1), tl.max(tile_amax(pre, True, READ_ORDER), axis=0))
        s += 1
    tl.store(hi_ptr + state_off, hi, mask=mask_s)
    tl.store(pre_ptr + state_off, pre, mask=mask_s)
    if RECUR_EF != RESIDUAL_NONE:
        tl.store(res_ptr + state_off, e, mask=mask_s)


@triton.jit
def segment_output(
    x_ptr, b_ptr, c_ptr, dt_ptr, read_hi_ptr, y_ptr, g_lo_ptr, hi_ptr, lo_ptr, head_off, A, b, s, h, g, S, L, H, P, N,
    G, offs_p, skip, SHARED: tl.constexpr, LO_OUTSIDE: tl.constexpr, SKIP: tl.constexpr, DOT: tl.constexpr,
    READ_DOT: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    CHUNK_N: tl.constexpr,
):
    """Segment s's outputs for head h, head_dim rows offs_p, stored in the y grid: G_{0..j} (S_src C_j) + sum_{i<=j}
    dt_i G_{i+1..j} (B_i . C_j) x_i, S_src = S_hi or S_lo per token (the head's [P, N] copies at the segment's start
    at head_off in hi_ptr and lo_ptr, read in chunks of CHUNK_N columns, which stay in L2). LO_OUTSIDE: tokens that
    read S_lo get no checkpoint term and their G_{0..j} goes to the g_lo grid (`triton_chunk._read_outside`).
    Returns the segment's entry indices row [BLOCK_L], x [BLOCK_L, BLOCK_P], dt and log G_{0..j} (cs) [BLOCK_L],
    which the fold takes."""
    offs_l = tl.arange(0, BLOCK_L)
    mask_l, mask_p = offs_l < L, offs_p < P
    row = (b * S + s).to(tl.int64) * L + offs_l  # [BLOCK_L] entry index in the grid
    dt = tl.load(dt_ptr + row * H + h, mask=mask_l, other=0.0)
    cs = tl.cumsum(dt * A, axis=0)  # log G_{0..j}
    x = tl.load(x_ptr + (row[:, None] * H + h) * P + offs_p[None, :], mask=mask_l[:, None] & mask_p[None, :], other=0.0)
    # over d_state in chunks: (B_i . C_j) and the checkpoint terms S_hi C_j, S_lo C_j
    bc = tl.zeros([BLOCK_L, BLOCK_L], dtype=tl.float32)
    y_hi = tl.zeros([BLOCK_L, BLOCK_P], dtype=tl.float32)
    y_lo = tl.zeros([BLOCK_L, BLOCK_P], dtype=tl.float32)
    for c in tl.static_range(0, BLOCK_N, CHUNK_N):
        offs_c = c + tl.arange(0, CHUNK_N)
        m_lc = mask_l[:, None] & (offs_c < N)[None, :]
        m_cp = (offs_c < N)[:, None] & mask_p[None, :]
        chunk = head_off + offs_p[None, :] * N + offs_c[:, None]  # [CHUNK_N, BLOCK_P] of the head's S^T
        cm = tl.load(c_ptr + (row[:, None] * G + g) * N + offs_c[None, :], mask=m_lc, other=0.0)
        b_c = tl.load(b_ptr + (row[:, None] * G + g) * N + offs_c[None, :], mask=m_lc, other=0.0)
        bc = dot_acc(cm, tl.trans(b_c), bc, READ_DOT)
        y_hi = dot_acc(cm, tl.load(hi_ptr + chunk, mask=m_cp, other=0.0), y_hi, READ_DOT)
        if not SHARED:
            if not LO_OUTSIDE:
                y_lo = dot_acc(cm, tl.load(lo_ptr + chunk, mask=m_cp, other=0.0), y_lo, READ_DOT)
    # intra-segment: sum_{i<=j} dt_i G_{i+1..j} (B_i . C_j) x_i
    causal = offs_l[:, None] >= offs_l[None, :]
    decay = tl.exp(tl.where(causal, cs[:, None] - cs[None, :], float("-inf")))
    y = dot(bc * decay * dt[None, :], x, DOT)
    # checkpoint term: G_{0..j} (S_src C_j), S_src = S_hi or S_lo per token
    g_read = tl.exp(cs)
    if SKIP:
        g_read = tl.where(g_read < skip, 0.0, g_read)
    y_src = y_hi
    if LO_OUTSIDE:  # tokens that read S_lo get their checkpoint term from torch: hand over their g_read
        rh = tl.load(read_hi_ptr + row, mask=mask_l, other=0)
        tl.store(g_lo_ptr + row * H + h, tl.where(rh != 0, 0.0, g_read), mask=mask_l)  # same in every P tile
        g_read = tl.where(rh != 0, g_read, 0.0)
    elif not SHARED:
        rh = tl.load(read_hi_ptr + row, mask=mask_l, other=0)
        y_src = tl.where(rh[:, None] != 0, y_hi, y_lo)
    y += g_read[:, None] * y_src
    tl.store(y_ptr + (row[:, None] * H + h) * P + offs_p[None, :], y, mask=mask_l[:, None] & mask_p[None, :])
    return row, x, dt, cs


@triton.jit
def _round_slots_kernel(
    slots_ptr, lo_ptr, fold_ptr, before_ptr, amax_ptr, ck_ptr, key_ptr,  # pre-images in, S_lo out [B, K + 1, H, P, N]
    S, S0, K, H, P, N,  # the block's segments [S0, S0 + K); amax [B, S, H]: the head's of each fold
    READ: tl.constexpr, READ_GROUP: tl.constexpr, READ_MAX: tl.constexpr, READ_ORDER: tl.constexpr,
    READ_RANDOM: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The read copy of each slot's pre-image, in place: slot k >= 1 holds the fold of segment S0 + k - 1 where it
    folded (the call's fold number S0 + k), slot 0 the copies at the block's start (the call's fold number `before`
    at S0: the S_lo given where it is 0)."""
    tile, k, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    offs_p = tile * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    elem = (h * P + offs_p[:, None]).to(tl.int64) * N + offs_n[None, :]  # [BLOCK_P, BLOCK_N] index in [H, P, N]
    first = tl.load(before_ptr + b * S + S0)
    done = tl.where(k == 0, first, S0 + k)  # the call's folds up to this slot
    wrote = (k == 0) | (tl.load(fold_ptr + b * S + S0 + k - 1, mask=k > 0, other=0) != 0)
    mask_s = (offs_p < P)[:, None] & (offs_n < N)[None, :] & wrote
    slot = (b * (K + 1) + k).to(tl.int64) * H * P * N + elem
    pre = tl.load(slots_ptr + slot, mask=mask_s, other=0.0)
    bits = state_bits(tl.load(key_ptr + 2 * b + 1), ((tl.load(ck_ptr + b) + done) << 32) + elem, offs_n[None, :], READ,
                      READ_RANDOM)
    # the head's amax of the fold that wrote the slot, from the fold programs' tiles
    amax = tl.load(amax_ptr + ((b * S + done - 1).to(tl.int64) * H + h) + tl.zeros([BLOCK_P, 1], tl.int64),
                   mask=done > 0, other=0.0)
    lo = quantize_tile(pre, bits, amax, READ, READ_GROUP, READ_MAX, READ_ORDER, BLOCK_P, BLOCK_N)
    given = tl.load(lo_ptr + b.to(tl.int64) * H * P * N + elem, mask=mask_s & (done == 0), other=0.0)
    tl.store(slots_ptr + slot, tl.where(done == 0, given, lo), mask=mask_s)


@triton.jit
def _segment_outputs_kernel(
    x_ptr, b_ptr, c_ptr, dt_ptr, read_hi_ptr, before_ptr,  # the grid as above, [B, S, L] int8; [B, S] folds before s
    A_ptr, hi_slots_ptr, lo_slots_ptr, y_ptr,  # [B, K + 1, H, P, N] x2 (S_hi, S_lo); the y grid [B, S, L, H, P]
    S, S0, K, L, H, P, N, G, HPG, skip,  # segments [S0, S0 + K)
    SKIP: tl.constexpr, DOT: tl.constexpr, READ_DOT: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK_N: tl.constexpr,
):
    """Segment S0 + k's outputs (`segment_output`) from the copies at its start: after `before` folds of the call,
    slot `before` - (`before` at S0) of the block."""
    pid, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    tiles = tl.cdiv(P, BLOCK_P)
    tile, s = pid % tiles, S0 + pid // tiles
    offs_p = tile * BLOCK_P + tl.arange(0, BLOCK_P)
    k = tl.load(before_ptr + b * S + s) - tl.load(before_ptr + b * S + S0)
    head = ((b * (K + 1) + k).to(tl.int64) * H + h) * P * N
    segment_output(x_ptr, b_ptr, c_ptr, dt_ptr, read_hi_ptr, y_ptr, y_ptr, hi_slots_ptr + head, lo_slots_ptr + head, 0,
                   tl.load(A_ptr + h), b, s, h, h // HPG, S, L, H, P, N, G, offs_p, skip, False, False, SKIP, DOT,
                   READ_DOT, BLOCK_L, BLOCK_P, BLOCK_N, CHUNK_N)


def phased(codecs: tuple[KernelCodec, KernelCodec], shared: bool) -> bool:
    """Whether `scan_in_phases` runs the in-loop codecs (S_hi's, S_lo's): a read copy with a head scale along d_state
    beside a recurrence copy whose groups lie in PROGRAM_ROWS head_dim rows (a recurrence copy's head scale needs every
    program of the head at each fold: `triton_chunk`'s exchange). Elsewhere the one loop of `triton_chunk` ran faster
    per layer on the H200, in one launch against three (BENCHMARKS.md, Chunked form)."""
    recur, read = codecs
    return not shared and read.group == Group.HEAD and read.natural and not recur.spans(PROGRAM_ROWS)


def phase_launch_config(recur: KernelCodec, d_state: int) -> dict:
    """FOLD_N of the fold programs (CHUNK_COLUMNS columns where the recurrence copy rounds elementwise, else all of
    d_state; the other programs hold all of it, BLOCK_N), num_warps of each kernel, DOT (the fold's and the
    intra-segment product's input_precision: FP32 FMAs, so the stored copies keep their bits) and READ_DOT (the
    products over d_state: three TF32 products, FP32-level error, as `triton_chunk.chunked_launch_config`)."""
    block_n = max(16, triton.next_power_of_2(d_state))
    elementwise = recur.group == Group.NONE and recur.block == 1 and recur.rot == 1
    return {"FOLD_N": min(CHUNK_COLUMNS, block_n) if elementwise else block_n, "BLOCK_N": block_n, "fold_warps": 4,
            "round_warps": 8, "output_warps": 2, "DOT": "ieee", "READ_DOT": "tf32x3"}


class PhaseState:
    """What a call's phased launches share: before [B, S] (int32, folds of the call before segment s: the slot of
    the copies it reads) and head_amax [B, S, H] (a head-scaled read copy's amax of each segment's fold)."""

    def __init__(self, num_folds: torch.Tensor, segments: int, heads: int):
        steps = torch.arange(segments, device=num_folds.device)
        self.before = torch.minimum(steps[None], num_folds[:, None]).to(torch.int32).contiguous()
        self.head_amax = torch.zeros(len(num_folds), segments, heads, dtype=torch.float32, device=num_folds.device)


def scan_in_phases(grid, A, hi, lo, pre, res_hi, y, checkpoint, keys, config, codecs, span,
                   phases: PhaseState) -> None:
    """The phases over the segments span = (s0, s1) of `grid` = (px, pB, pC, pdt, read_hi, folds), in blocks of
    segments whose slots fit _SLOT_ELEMENTS. hi and pre ([B, H, P, N] fp32: S_hi and the newest fold's pre-image),
    res_hi (S_hi's error-feedback residual where its codec's `ef` says) and y (the [B, S, L, H, P] output grid) are
    updated in place; lo (the S_lo given) is read only."""
    px, pB, pC, pdt, read_hi, folds = grid
    batch, S, L, H, P = px.shape
    G, N = pB.shape[3], pB.shape[4]
    recur, read = codecs
    launch = phase_launch_config(recur, N)
    skip = config.skip_read_below
    tiles_p, tiles_n = triton.cdiv(P, PROGRAM_ROWS), triton.cdiv(N, launch["FOLD_N"])
    block = max(1, _SLOT_ELEMENTS // (batch * H * P * N) - 1)
    common = dict(BLOCK_L=window_rows(L), BLOCK_P=PROGRAM_ROWS, SKIP=skip is not None, DOT=launch["DOT"])
    for s0 in range(span[0], span[1], block):
        k = min(span[1], s0 + block) - s0
        hi_slots = torch.empty(batch, k + 1, H, P, N, dtype=torch.float32, device=hi.device)
        pre_slots = torch.empty_like(hi_slots)
        tile_maxima = torch.empty(batch, k, H, tiles_p * tiles_n, dtype=torch.float32, device=hi.device)
        _fold_chain_kernel[(tiles_n, tiles_p, batch * H)](
            px, pB, pdt, folds, A, hi, pre, checkpoint, keys, res_hi, hi_slots, pre_slots, tile_maxima,
            S, s0, s0 + k, L, H, P, N, G, H // G, tiles_p * tiles_n, float(skip or 0.0),
            **recur.constexprs("RECUR"), RECUR_EF=int(recur.ef), READ_ORDER=int(read.order), BUF=buffer_kind(config),
            BLOCK_N=launch["FOLD_N"],
            num_warps=launch["fold_warps"], **common,
        )
        phases.head_amax[:, s0:s0 + k] = tile_maxima.amax(-1)
        _round_slots_kernel[(tiles_p, k + 1, batch * H)](  # the slots' pre-images become the read copies
            pre_slots, lo, folds, phases.before, phases.head_amax, checkpoint, keys, S, s0, k, H, P, N,
            READ=int(read.kind), READ_GROUP=int(read.group), READ_MAX=read.max, READ_ORDER=int(read.order),
            READ_RANDOM=read.random, BLOCK_P=PROGRAM_ROWS, BLOCK_N=launch["BLOCK_N"], num_warps=launch["round_warps"],
        )
        _segment_outputs_kernel[(tiles_p * k, H, batch)](
            px, pB, pC, pdt, read_hi, phases.before, A, hi_slots, pre_slots, y, S, s0, k, L, H, P, N, G, H // G,
            float(skip or 0.0), READ_DOT=launch["READ_DOT"], BLOCK_N=launch["BLOCK_N"],
            CHUNK_N=min(CHUNK_COLUMNS, launch["BLOCK_N"]), num_warps=launch["output_warps"], **common,
        )

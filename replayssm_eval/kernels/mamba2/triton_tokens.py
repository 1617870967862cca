"""Mamba-2's chunked scan of one-token windows with the state in registers (window 1: conventional decoding with a
stored state, the engine presets' `vllm:int16sr`, `flashinfer:int16`, `stepquant:dualaxis6`, ...).

With window 1 every token folds, and the next token reads the rounded copies: the scan is a chain of one fold and
one rounding per token. `triton_chunk`'s one loop stores each fold and reads it back through L2 with barriers between;
here a program holds its tile of the copies [BLOCK_P, d_state] in registers for the whole call and, per token,
computes the output from the copies at the token's start, folds and rounds, while the next token's inputs load.

The fold is the one loop's and the fold chain's of one row (`fold_weights`' w = dt, `tile_dot.add_dot`'s explicit
FMA) and the roundings take the same tiles, keys and counters: the stored copies are the one loop's bit for bit, on
the GPU too. The outputs are FP32 sums over d_state in another order than the loop's chunks of CHUNK_COLUMNS.
What bounds it with stochastic rounding is the Philox4x32-10 words each fold draws (`state_bits`): about 60 integer
multiplies a call, one call an element (`words=element`) or a group of 2 or 4 (`duo`, `quad`: the stochastic
engine presets whose engines' words are unread).
STEPQuant's dual-axis factors (key rows along d_state) fit each head_dim index's column factor from its own row of
the tile, but a row factor from a sum over the whole head_dim: on a GPU the head's programs of 16 rows exchange their
FP64 partial sums at every fold (`head_exchange.shared_head_sums`; programs numbered in start order), elsewhere one
program holds the whole head.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import Group, KernelCodec
from replayssm_eval.formats.device import RESIDUAL_NONE, feedback_residual, feedback_target, state_bits
from replayssm_eval.kernels.head_exchange import round_state_copy, sums_exchanged, ticket_ids
from replayssm_eval.kernels.mamba2.triton_phases import PROGRAM_ROWS, fold_weights
from replayssm_eval.kernels.tile_dot import add_dot
from replayssm_eval.replay.buffer_round import BUF_FP32, buffer_kind, round_buffered


@triton.jit
def _token_inputs(x_ptr, b_ptr, c_ptr, dt_ptr, read_hi_ptr, fold_ptr, b, s, S, H, P, N, G, h, g, offs_p, offs_n):
    """Token s of sequence b in the grid (its one-entry segment), zeros at s = S: x [1, BLOCK_P], B and C
    [1, BLOCK_N], dt [1], whether it reads S_hi and whether it folds (int8 scalars)."""
    live = s < S
    row = (b * S + s).to(tl.int64) + tl.arange(0, 1)  # [1] entry index in the grid
    m_p = live & (offs_p < P)[None, :]
    m_n = live & (offs_n < N)[None, :]
    x = tl.load(x_ptr + (row[:, None] * H + h) * P + offs_p[None, :], mask=m_p, other=0.0)
    keys = tl.load(b_ptr + (row[:, None] * G + g) * N + offs_n[None, :], mask=m_n, other=0.0)
    queries = tl.load(c_ptr + (row[:, None] * G + g) * N + offs_n[None, :], mask=m_n, other=0.0)
    dt = tl.load(dt_ptr + row * H + h, mask=live, other=0.0)
    reads_hi = tl.load(read_hi_ptr + b * S + s, mask=live, other=0)
    folds = tl.load(fold_ptr + b * S + s, mask=live, other=0)
    return x, keys, queries, dt, reads_hi, folds


@triton.jit
def _token_scan_kernel(
    x_ptr, b_ptr, c_ptr, dt_ptr, read_hi_ptr, fold_ptr,  # the grid of one-entry segments: [B, S, 1, H, P], [B, S, 1, G, N] x2, [B, S, 1, H], [B, S, 1], [B, S]
    A_ptr, hi_ptr, lo_ptr, pre_ptr, y_ptr, ck_ptr, key_ptr,  # [H]; S_hi, S_lo, the newest pre-image [B, H, P, N] (in place: pre at the last fold); y [B, S, 1, H, P]; [B]; [B, 2]
    res_hi_ptr, res_lo_ptr, res_pre_ptr,  # error-feedback residuals [B, H, P, N] in place; the packed copy's before the last fold
    exch_ptr, count_ptr, ticket_ptr,  # PROGRAMS > 1: [B * H, 2, PROGRAMS, BLOCK_N], [B * H] (`shared_head_sums`); [1]
    S, H, P, N, G, HPG, TILES, skip,
    RECUR: tl.constexpr, RECUR_GROUP: tl.constexpr, RECUR_MAX: tl.constexpr, RECUR_ORDER: tl.constexpr,
    RECUR_RANDOM: tl.constexpr, RECUR_ROWS: tl.constexpr, RECUR_COLS: tl.constexpr, RECUR_AXIS: tl.constexpr,
    RECUR_ROT: tl.constexpr,
    READ: tl.constexpr, READ_GROUP: tl.constexpr, READ_MAX: tl.constexpr, READ_ORDER: tl.constexpr,
    READ_RANDOM: tl.constexpr, READ_ROWS: tl.constexpr, READ_COLS: tl.constexpr, READ_AXIS: tl.constexpr,
    READ_ROT: tl.constexpr, RECUR_EF: tl.constexpr, READ_EF: tl.constexpr,
    SHARED: tl.constexpr, SKIP: tl.constexpr, BUF: tl.constexpr, DOT: tl.constexpr,
    PROGRAMS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, ROW0,  # the launch's first head_dim row
):
    if PROGRAMS > 1:  # the head's programs exchange: they start one after another
        tile, h, b = ticket_ids(ticket_ptr, TILES, H)
        bh = b * H + h
    else:
        tile, bh = tl.program_id(0), tl.program_id(1)
        b, h = bh // H, bh % H
    g = h // HPG
    offs_p = ROW0 + tile * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_s = mask_p[:, None] & (offs_n < N)[None, :]
    # [BLOCK_P, BLOCK_N] index in [H, P, N] (int32, as few registers as the loop can keep: H P N < 2^31)
    elem = (h * P + offs_p[:, None]) * N + offs_n[None, :]
    seq = b.to(tl.int64) * H * P * N  # the sequence's offset in [B, H, P, N]
    A = tl.load(A_ptr + h)
    ck = tl.load(ck_ptr + b)
    key_hi = tl.load(key_ptr + 2 * b)
    key_lo = tl.load(key_ptr + 2 * b + 1)
    hi = tl.load(hi_ptr + seq + elem, mask=mask_s, other=0.0)  # padding zero: it never raises an amax
    lo = hi
    if not SHARED:
        lo = tl.load(lo_ptr + seq + elem, mask=mask_s, other=0.0)
    e_hi = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)  # the copies' error-feedback residuals, zero without
    e_lo = e_hi
    if RECUR_EF != RESIDUAL_NONE:
        e_hi = tl.load(res_hi_ptr + seq + elem, mask=mask_s, other=0.0)
    if (READ_EF != RESIDUAL_NONE) and (not SHARED):
        e_lo = tl.load(res_lo_ptr + seq + elem, mask=mask_s, other=0.0)
    following = _token_inputs(x_ptr, b_ptr, c_ptr, dt_ptr, read_hi_ptr, fold_ptr, b, 0, S, H, P, N, G, h, g, offs_p,
                              offs_n)
    rnd = 0  # the head's exchanges so far (`shared_head_sums`)
    s = 0
    while s < S:  # a while loop: the interpreter cannot take range() of a runtime scalar
        x, keys, queries, dt, reads_hi, folds = following
        following = _token_inputs(x_ptr, b_ptr, c_ptr, dt_ptr, read_hi_ptr, fold_ptr, b, s + 1, S, H, P, N, G, h, g,
                                  offs_p, offs_n)
        cs = tl.cumsum(dt * A, axis=0)  # [1] log G_{0..0}, as the one loop computes it
        # the output from the copies at the token's start: dt (B . C) x + G (S_src C), S_src = S_hi or S_lo
        g_read = tl.exp(cs)
        if SKIP:
            g_read = tl.where(g_read < skip, 0.0, g_read)
        y_src = tl.sum(hi * queries, axis=1)  # [BLOCK_P]
        if not SHARED:
            y_src = tl.where(reads_hi != 0, y_src, tl.sum(lo * queries, axis=1))
        bc = tl.sum(keys * queries, axis=1)  # [1]
        y = (bc * dt)[:, None] * x + g_read[:, None] * y_src[None, :]  # [1, BLOCK_P]
        tl.store(y_ptr + ((b * S + s).to(tl.int64) * H + h) * P + offs_p[None, :], y, mask=mask_p[None, :])
        if folds != 0:
            g_seg, w = fold_weights(dt, cs, skip, SKIP, 1)
            if BUF == BUF_FP32:
                xt = tl.trans(x * w[:, None])  # [BLOCK_P, 1]
            else:  # the scaled keys dt_i B_i in the buffer dtype before the product, as vLLM's fold
                xt = tl.trans(x)
                keys = round_buffered(keys * w[:, None], BUF)
            pre = add_dot(g_seg * hi, xt, keys, DOT)
            if following[5] == 0:  # the next token does not fold: this is the call's newest pre-image
                tl.store(pre_ptr + seq + elem, pre, mask=mask_s)
                if SHARED and (RECUR_EF != RESIDUAL_NONE):  # and the packed copy's residual before it
                    tl.store(res_pre_ptr + seq + elem, e_hi, mask=mask_s)
                if (not SHARED) and (READ_EF != RESIDUAL_NONE):
                    tl.store(res_pre_ptr + seq + elem, e_lo, mask=mask_s)
            counter = ((ck + s + 1) << 32) + elem
            target = feedback_target(pre, e_hi, RECUR_EF)
            hi, rnd = round_state_copy(target, state_bits(key_hi, counter, offs_n[None, :], RECUR, RECUR_RANDOM),
                                      exch_ptr, count_ptr, bh, rnd, tile, RECUR, RECUR_GROUP, RECUR_MAX, RECUR_ORDER,
                                      RECUR_ROWS, RECUR_COLS, RECUR_AXIS, RECUR_ROT, PROGRAMS, BLOCK_P, BLOCK_N)
            if RECUR_EF != RESIDUAL_NONE:
                e_hi = feedback_residual(target, hi, RECUR_EF)
            if not SHARED:  # a shared checkpoint's outputs read hi only
                target = feedback_target(pre, e_lo, READ_EF)
                lo, rnd = round_state_copy(target, state_bits(key_lo, counter, offs_n[None, :], READ, READ_RANDOM),
                                          exch_ptr, count_ptr, bh, rnd, tile, READ, READ_GROUP, READ_MAX, READ_ORDER,
                                          READ_ROWS, READ_COLS, READ_AXIS, READ_ROT, PROGRAMS, BLOCK_P, BLOCK_N)
                if READ_EF != RESIDUAL_NONE:
                    e_lo = feedback_residual(target, lo, READ_EF)
        s += 1
    tl.store(hi_ptr + seq + elem, hi, mask=mask_s)
    if not SHARED:
        tl.store(lo_ptr + seq + elem, lo, mask=mask_s)
    if RECUR_EF != RESIDUAL_NONE:
        tl.store(res_hi_ptr + seq + elem, e_hi, mask=mask_s)
    if (READ_EF != RESIDUAL_NONE) and (not SHARED):
        tl.store(res_lo_ptr + seq + elem, e_lo, mask=mask_s)


def token_rows(codecs: tuple[KernelCodec, ...], head_dim: int, exchange: bool) -> int | None:
    """head_dim rows per program of `scan_tokens` for the copies' in-loop codecs: PROGRAM_ROWS, or twice that where a
    copy's scale tiles, blocks or rotation runs span 32 head_dim rows (SGLang's FP8 tiles, ModelOpt's Hadamard runs),
    so that every program holds them whole; for dual-axis factors along head_dim (`sums_exchanged`), PROGRAM_ROWS
    where the head's programs may exchange their row sums (`exchange`: `can_exchange`), else the whole head (padded
    to a power of two). None where it cannot run them: a copy rounded by torch (codec None), or whose scale groups
    span more rows (head scales, column factors, dual-axis factors along d_state: the one loop's whole-head programs
    or exchanges)."""
    if any(c is None for c in codecs):
        return None
    rest = [c for c in codecs if not sums_exchanged(c)]
    rows = next((rows for rows in (PROGRAM_ROWS, 2 * PROGRAM_ROWS) if not any(c.spans(rows) for c in rest)), None)
    if rows is None or len(rest) == len(codecs) or (exchange and rows == PROGRAM_ROWS):
        return rows
    return max(rows, triton.next_power_of_2(head_dim))


def token_launch_config(stochastic: bool, rows: int, exchange: bool) -> dict:
    """num_warps, maxnreg and DOT (the fold's product: FP32 FMAs, as the one loop's) of `_token_scan_kernel` for
    programs of `rows` head_dim rows whose copies round with or without stochastic rounding, exchanging dual-axis row
    sums or not (benchmarks/layer_speed.py sweeps them). Every program runs the call's whole chain of folds, so
    programs that wait for a free SM add whole chains: the Philox words of SR take registers, and capping them at 128
    (two programs an SM) ran faster on the H200 at Nemotron-3-Nano-4B's geometry (BENCHMARKS.md, KL path at full
    size). Programs of 32 rows take twice the warps, keeping each thread's 8 elements of a [16, 128] tile at 8 warps
    (`sglang:fp8` on an H200: no swept launch faster); a whole head at most 16. A head's exchanging programs (five at
    head_dim 80) take 8 warps of at most 64 registers, so that four programs fit an SM and a batch of one sequence
    (480 programs at 96 heads) runs at once: the H100 sweep's best, 1.18x 4 warps of at most 128 (BENCHMARKS.md,
    STEPQuant's row sums exchanged between a head's programs)."""
    if exchange:
        return {"num_warps": 8, "maxnreg": 64, "DOT": "ieee"}
    return {"num_warps": min(16, 8 * rows // PROGRAM_ROWS), "maxnreg": 128 if stochastic else None, "DOT": "ieee"}


def tail_codecs(codecs: tuple[KernelCodec, ...], head_dim: int, rows: int) -> tuple[KernelCodec, ...] | None:
    """The codecs of a launch of PROGRAM_ROWS-row programs for the last head_dim rows past the whole slabs of `rows`,
    where programs of `rows` would leave rows masked (head_dim 80 in slabs of 32: 16 rows of each head's third
    program): each scale tile along d_state cut to PROGRAM_ROWS rows, which then hold every valid row of the last
    tile (the rows past head_dim are zero, so its amax and every rounding are the same). None where there is no such
    tail, or a copy's groups, blocks or runs along head_dim would be cut."""
    tail = head_dim % rows
    if rows == PROGRAM_ROWS or tail == 0 or tail > PROGRAM_ROWS:
        return None
    cut = []
    for c in codecs:
        if not c.spans(PROGRAM_ROWS):
            cut.append(c)
        elif c.axis == "dstate" and c.group == Group.TILE:
            cut.append(dataclasses.replace(c, rows=PROGRAM_ROWS))
        else:
            return None
    return tuple(cut)


def scan_tokens(grid, A, hi, lo, pre, res, y, checkpoint, keys, config, codecs: tuple[KernelCodec, KernelCodec],
                rows: int) -> None:
    """Every one-token segment of `grid` = (px, pB, pC, pdt, read_hi, folds) in programs of `rows` head_dim rows
    (`token_rows`; a head's programs exchange the row sums of dual-axis factors where `rows` leaves it several), and
    the rows past their whole slabs in a second launch of programs of PROGRAM_ROWS where `tail_codecs` allows (the
    same bits, fewer masked rows). hi, lo (S_lo; the same tensor for a shared checkpoint) and pre ([B, H, P, N] fp32),
    res = (res_hi, res_lo, res_pre) (the copies' error-feedback residuals where their codecs' `ef` says, and the
    packed copy's before the last fold) and the y grid [B, S, 1, H, P] are updated in place."""
    px, pB, pC, pdt, read_hi, folds = grid
    batch, S, L, H, P = px.shape
    G, N = pB.shape[3], pB.shape[4]
    assert L == 1, f"scan_tokens takes one-entry segments, got {L}"
    skip = config.skip_read_below
    block_n = max(16, triton.next_power_of_2(N))
    tail = tail_codecs(codecs, P, rows)
    if tail is None:
        launches = [(codecs, rows, 0, triton.cdiv(P, rows))]
    else:  # the whole slabs (none where head_dim is under `rows`), then the rest in one program a head
        whole = P // rows
        launches = [(codecs, rows, 0, whole)] if whole else []
        launches.append((tail, PROGRAM_ROWS, whole * rows, 1))
    for (recur, read), block_p, row0, tiles in launches:  # a shared checkpoint's read codec is its own
        programs = tiles if any(sums_exchanged(c) for c in (recur, read)) else 1
        exch = hi  # `shared_head_sums`' slots, unread without an exchange
        if programs > 1:
            exch = torch.empty(batch * H * 2 * programs * block_n, dtype=torch.int64, device=hi.device)
        count = torch.zeros(batch * H + 1, dtype=torch.int32, device=hi.device)  # the exchange's counters, the ticket
        launch = token_launch_config(recur.stochastic or read.stochastic, block_p, programs > 1)
        _token_scan_kernel[(tiles, batch * H)](
            px, pB, pC, pdt, read_hi, folds, A, hi, lo, pre, y, checkpoint, keys, *res, exch, count, count[-1:], S, H,
            P, N, G, H // G, tiles, float(skip or 0.0),
            **recur.constexprs("RECUR"), **read.constexprs("READ"), RECUR_EF=int(recur.ef), READ_EF=int(read.ef),
            SHARED=config.shared, SKIP=skip is not None, BUF=buffer_kind(config), DOT=launch["DOT"],
            PROGRAMS=programs, BLOCK_P=block_p, BLOCK_N=block_n, ROW0=row0, num_warps=launch["num_warps"],
            maxnreg=launch["maxnreg"],
        )


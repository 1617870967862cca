"""Triton chunked scan of ReplaySSM Mamba-2 with in-loop quantization (`chunked(..., backend="triton")`).

Layering (mamba_ssm style): `_x_kernel` (Triton) -> `_x` (allocation, grid) -> public function.

- `chunked_triton_prepared` (= `chunked(..., backend="triton")`): for one-token segments (window 1) whose copies round
  in programs of 16 head_dim rows (STEPQuant's dual-axis factors too, exchanging row sums on a GPU), `triton_tokens`'
  scan with the state in registers; for a read copy with a head
  scale along d_state beside a recurrence copy whose groups lie in 16 head_dim rows, the phases of `triton_phases`
  (the fold chain alone, then the read copies, then every segment's outputs at once). Else one launch, one program per (head_dim
  tile, head, sequence), loops over the segments of the plan: intra-segment outputs
  (`triton_phases.segment_output`), checkpoint reads, the fold, and both stored copies rounded in the kernel (SR
  bits from `tl.randint` with the keys and counters of `replay.keys`). In-kernel rounding
  covers formats whose scale group lies inside one program's tile (the format's kernel codec, `tile_codec`): fp32,
  bf16, fp16, fp16sr (every words=, cvt=, rounds= and bits=); fp8, fp8sr, fp8e5m2, int8, int8sr, int16, int16sr with
  scale=row|head|none|rowcol and scale=block:N|tile:RxC of power-of-two sizes (or 0) along d_state (`pimba:int8sr`,
  `sglang:fp8`) or head_dim (axis=headdim); nvfp4 (scale=row|head|rowcol), mxfp8, mxfp4 and Pimba's mx8 / mx8sr on
  either axis (SR with any bits= and rounds=); and any of these with rot=hadamard:N (runs of N along the format's
  axis, N a power of two dividing that dim); STEPQuant's dualaxis (row and column factors over the head). A program
  holds 16 rows of the head, or the whole head for tiles of more than 16 rows, for two-axis scales (rowcol: column
  factors over the head; dualaxis) and for anything spanning more than 16 head_dim rows along head_dim (row scales,
  long blocks). A head scale along d_state without rotation keeps the
  programs of 16 rows: a recurrence copy's (and a read copy's beside it) on a GPU by exchanging the head's amax
  between the head's programs at each fold (`head_exchange`; programs are numbered in start order), else (the
  interpreter) in a program holding the whole head; a read copy's alone, which never feeds the fold, from the amax
  of the fold programs' tiles (`triton_phases`). The other formats (tensor-wide scales, tiles of other sizes,
  rotation runs that do not tile their dim) are rounded by torch with `write_checkpoint`'s encoding, keys and
  checkpoint indices. A read copy (split config) in two passes per block of segments, exact because S_lo
  never feeds the fold: the kernel reads S_hi only and stores every FP32 fold, then torch rounds
  the block's folds to S_lo at once and adds the checkpoint term of the tokens that read S_lo
  (`_read_outside`). A recurrence copy or shared checkpoint feeds the next segment, so the kernel
  runs one segment per launch keeping the FP32 fold, and torch rounds S_hi of the sequences that
  folded before the next launch (`_scan`). Error feedback (ef=) rounds fold + residual in the one loop, the token
  scan and the phases' fold chain (a read copy with feedback takes the one loop), the residuals read and written in
  place (`feedback_in_kernel`); FP64 compute, and a copy with feedback that torch rounds, fall back to the torch
  backend, with a warning.
The kernel computes in FP32 (`tile_dot.dot`; one-token windows take one row, not 16): the fold in FP32 FMAs
(input_precision "ieee"), so the stored copies' bits do not depend on the launch; a segment's products over d_state
(B . C and the checkpoint terms) as three TF32 tensor-core products ("tf32x3", FP32-level error), read from memory
in chunks of CHUNK_COLUMNS columns. No state stays in registers between segments: each fold is stored (pre-image,
S_hi, S_lo) and read back, from L2 (BENCHMARKS.md, Chunked form).
"""

from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import FP32_CODEC, Group, KernelCodec, tile_codec
from replayssm_eval.formats.device import RESIDUAL_NONE, feedback_residual, feedback_target, state_bits
from replayssm_eval.kernels.head_exchange import can_exchange, exchange_programs, round_state_copy, ticket_ids
from replayssm_eval.kernels.mamba2._common import Inputs, group_heads, merge_packed
from replayssm_eval.kernels.mamba2.chunked import Segments, chunked_torch
from replayssm_eval.kernels.mamba2.triton_phases import (
    CHUNK_COLUMNS, PROGRAM_ROWS, PhaseState, fold_weights, phased, scan_in_phases, segment_output,
)
from replayssm_eval.kernels.mamba2.triton_tokens import scan_tokens, token_rows
from replayssm_eval.kernels.tile_dot import add_dot, window_rows
from replayssm_eval.replay.buffer_round import BUF_FP32, buffer_kind, round_buffered
from replayssm_eval.replay.keys import READ_COPY, RECUR_COPY, sr_keys
from replayssm_eval.replay.schedule import TokenPlan
from replayssm_eval.replay.state import (
    ReplayState, carries_feedback, encode_keyed, feedback_copies, round_folded, write_read_copy_packed,
)

_FOLD_BLOCK_ELEMENTS = 1 << 26  # FP32 folds held at once by `_read_outside` (256 MiB): batch * segments * H * P * N


@triton.jit
def _feedback_target(folded, res_ptr, res_pre_ptr, off, mask, EF: tl.constexpr, PACKED: tl.constexpr):
    """What a copy rounds from the fold tile (`feedback_target`): folded plus its error-feedback residual (EF:
    `Residual`), which goes to res_pre too where the copy is the packed one (PACKED), for `write_read_copy_packed`;
    folded without feedback."""
    e = folded
    if EF != RESIDUAL_NONE:
        e = tl.load(res_ptr + off, mask=mask, other=0.0)
        if PACKED:
            tl.store(res_pre_ptr + off, e, mask=mask)
    return feedback_target(folded, e, EF)


@triton.jit
def _chunk_scan_kernel(
    x_ptr, b_ptr, c_ptr, dt_ptr, read_hi_ptr, fold_ptr,  # padded segment grid: [B, S, L, H, P], [B, S, L, G, N] x2, [B, S, L, H], [B, S, L], [B, S]
    A_ptr, hi_ptr, lo_ptr, pre_ptr, y_ptr, ck_ptr, key_ptr,
    out_ptr, g_lo_ptr,  # LO_OUTSIDE: folds [B, SLOTS, H, P, N] (segment s in slot s - OUT0 + 1), g_read [B, S, L, H]
    exch_ptr, count_ptr, ticket_ptr,  # PROGRAMS > 1: [B * H, 2, PROGRAMS], [B * H] (`shared_head_amax`); [1]
    res_hi_ptr, res_lo_ptr, res_pre_ptr,  # error-feedback residuals [B, H, P, N] in place; the packed copy's before the newest fold
    S, S0, S1, OUT0, SLOTS, L, H, P, N, G, HPG, TILES, skip,  # this launch runs segments [S0, S1) of the S in the grid
    RECUR: tl.constexpr, RECUR_GROUP: tl.constexpr, RECUR_MAX: tl.constexpr, RECUR_ORDER: tl.constexpr,
    RECUR_RANDOM: tl.constexpr, RECUR_ROWS: tl.constexpr, RECUR_COLS: tl.constexpr, RECUR_AXIS: tl.constexpr,
    RECUR_ROT: tl.constexpr,
    READ: tl.constexpr, READ_GROUP: tl.constexpr, READ_MAX: tl.constexpr, READ_ORDER: tl.constexpr,
    READ_RANDOM: tl.constexpr, READ_ROWS: tl.constexpr, READ_COLS: tl.constexpr, READ_AXIS: tl.constexpr,
    READ_ROT: tl.constexpr, RECUR_EF: tl.constexpr, READ_EF: tl.constexpr,
    SHARED: tl.constexpr, LO_OUTSIDE: tl.constexpr, SKIP: tl.constexpr, DOT: tl.constexpr, READ_DOT: tl.constexpr,
    BUF: tl.constexpr, PROGRAMS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    CHUNK_N: tl.constexpr,
):
    tile, h, b = ticket_ids(ticket_ptr, TILES, H)  # a head's TILES programs start one after another
    g = h // HPG
    offs_l = tl.arange(0, BLOCK_L)
    offs_p = tile * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_l, mask_p, mask_n = offs_l < L, offs_p < P, offs_n < N
    mask_s = mask_p[:, None] & mask_n[None, :]
    elem = (h * P + offs_p[:, None]).to(tl.int64) * N + offs_n[None, :]  # [BLOCK_P, BLOCK_N] index in [H, P, N]
    state_off = b.to(tl.int64) * H * P * N + elem
    # no state in registers across segments: each fold goes to the pre-image in chunks of CHUNK_N columns and is read
    # back whole for the rounding, S_hi and S_lo are stored at each fold, and a segment reads its checkpoint terms from
    # memory in chunks (a head's copies stay in L2), so that the products over d_state take small tiles
    A = tl.load(A_ptr + h)
    ck = tl.load(ck_ptr + b)
    key_hi = tl.load(key_ptr + 2 * b)
    key_lo = tl.load(key_ptr + 2 * b + 1)
    bh = b * H + h
    head_off = bh.to(tl.int64) * P * N
    rnd = 0  # the head's exchanges so far (`shared_head_amax`)
    s = S0
    while s < S1:  # a while loop: the interpreter cannot take range() of a runtime scalar
        row, x, dt, cs = segment_output(
            x_ptr, b_ptr, c_ptr, dt_ptr, read_hi_ptr, y_ptr, g_lo_ptr, hi_ptr, lo_ptr, head_off, A, b, s, h, g, S, L, H,
            P, N, G, offs_p, skip, SHARED, LO_OUTSIDE, SKIP, DOT, READ_DOT, BLOCK_L, BLOCK_P, BLOCK_N,
            CHUNK_N)
        if tl.load(fold_ptr + b * S + s) != 0:
            g_seg, w = fold_weights(dt, cs, skip, SKIP, BLOCK_L)
            if BUF == BUF_FP32:
                xt = tl.trans(x * w[:, None])  # [BLOCK_P, BLOCK_L]
            else:  # the scaled keys dt_i G_{i+1..L-1} B_i in the buffer dtype before the dot, as vLLM's fold
                xt = tl.trans(x)
            for c in tl.static_range(0, BLOCK_N, CHUNK_N):
                offs_c = c + tl.arange(0, CHUNK_N)
                m_pc = mask_p[:, None] & (offs_c < N)[None, :]
                part = head_off + offs_p[:, None] * N + offs_c[None, :]  # [BLOCK_P, CHUNK_N] of the head's state
                b_c = tl.load(b_ptr + (row[:, None] * G + g) * N + offs_c[None, :],
                              mask=mask_l[:, None] & (offs_c < N)[None, :], other=0.0)
                if BUF != BUF_FP32:
                    b_c = round_buffered(b_c * w[:, None], BUF)
                tl.store(pre_ptr + part, add_dot(g_seg * tl.load(hi_ptr + part, mask=m_pc, other=0.0), xt, b_c, DOT),
                         mask=m_pc)
            tl.debug_barrier()  # the fold's chunks come back through other threads
            folded = tl.load(pre_ptr + state_off, mask=mask_s, other=0.0)  # the newest fold's pre-image
            counter = ((ck + s + 1) << 32) + elem
            target = _feedback_target(folded, res_hi_ptr, res_pre_ptr, state_off, mask_s, RECUR_EF, SHARED)
            hi, rnd = round_state_copy(target, state_bits(key_hi, counter, offs_n[None, :], RECUR, RECUR_RANDOM),
                                      exch_ptr, count_ptr, bh, rnd, tile, RECUR, RECUR_GROUP, RECUR_MAX, RECUR_ORDER,
                                      RECUR_ROWS, RECUR_COLS, RECUR_AXIS, RECUR_ROT, PROGRAMS, BLOCK_P, BLOCK_N)
            if RECUR_EF != RESIDUAL_NONE:
                tl.store(res_hi_ptr + state_off, feedback_residual(target, hi, RECUR_EF), mask=mask_s)
            if LO_OUTSIDE:
                slot = b.to(tl.int64) * SLOTS + s - OUT0 + 1
                tl.store(out_ptr + slot * H * P * N + elem, folded, mask=mask_s)
            elif not SHARED:
                target = _feedback_target(folded, res_lo_ptr, res_pre_ptr, state_off, mask_s, READ_EF, True)
                lo, rnd = round_state_copy(target, state_bits(key_lo, counter, offs_n[None, :], READ, READ_RANDOM),
                                          exch_ptr, count_ptr, bh, rnd, tile, READ, READ_GROUP, READ_MAX, READ_ORDER,
                                          READ_ROWS, READ_COLS, READ_AXIS, READ_ROT, PROGRAMS, BLOCK_P, BLOCK_N)
                if READ_EF != RESIDUAL_NONE:
                    tl.store(res_lo_ptr + state_off, feedback_residual(target, lo, READ_EF), mask=mask_s)
                tl.store(lo_ptr + state_off, lo, mask=mask_s)
            tl.store(hi_ptr + state_off, hi, mask=mask_s)
            tl.debug_barrier()  # the next segment reads the copies back through other threads
        s += 1


def _chunk_scan(grid, A, hi, lo, pre, res, y, checkpoint, keys, config, codecs, span, phases, outside=None):
    """The segments span = (s0, s1) of `grid` = (px, pB, pC, pdt, read_hi, folds): in phases given the call's
    `PhaseState` (a head-scaled read copy, `triton_phases.phased`; lo, the S_lo given, is then read only), else
    (phases None) in one loop over the segments. hi, lo ([B, H, P, N] fp32), pre (the FP32 pre-image of the newest
    fold) and y (the [B, S, L, H, P] output grid) are updated in place; so are res = (res_hi, res_lo, res_pre), the
    copies' error-feedback residuals [B, H, P, N] where their codecs' `ef` says and the packed copy's residual before
    the newest fold (the phases: S_hi's only, `runs_in_phases`).

    outside: None (both copies rounded in the loop),
    or (out [B, slots, H, P, N], g_lo [B, S, L, H], first) for a read copy rounded after the kernel: tokens that read
    S_lo get no checkpoint term, their g_read goes to g_lo (0 elsewhere), and the fold of segment s goes to
    out[:, s - first + 1].
    """
    if phases is not None:
        scan_in_phases(grid, A, hi, lo, pre, res[0], y, checkpoint, keys, config, codecs, span, phases)
        return
    px, pB, pC, pdt, read_hi, folds = grid
    batch, S, L, H, P = px.shape
    G, N = pB.shape[3], pB.shape[4]
    recur, read = codecs
    out, g_lo, first = outside if outside is not None else (hi, hi, 0)  # not touched without LO_OUTSIDE
    copies = (recur,) if config.shared else (recur, read)  # the copies the loop rounds (LO_OUTSIDE: read is FP32)
    # a natural-basis head scale of the recurrence copy spans the head's programs of PROGRAM_ROWS rows, which exchange
    # its amax (a head-scaled read copy then too); any other copy whose groups span more rows takes programs holding
    # the whole head
    head_split = lambda c: c.group == Group.HEAD and c.natural  # noqa: E731
    programs = 1
    if head_split(recur) and not any(c.spans(PROGRAM_ROWS) and not head_split(c) for c in copies):
        slabs = triton.cdiv(P, PROGRAM_ROWS)
        programs = exchange_programs(list(copies), slabs, hi.device)  # programs numbered in start order
    launch = chunked_launch_config(P, N, programs == 1 and any(c.spans(PROGRAM_ROWS) for c in copies))
    block_p = launch["BLOCK_P"]
    skip = config.skip_read_below
    block_n = max(16, triton.next_power_of_2(N))
    tiles = triton.cdiv(P, block_p)
    exch = folds  # `shared_head_amax`'s slots, unread by a launch without an exchange
    if programs > 1:
        exch = torch.empty(batch * H * 2 * programs, dtype=torch.int32, device=hi.device)
    count = torch.zeros(batch * H + 1, dtype=torch.int32, device=hi.device)  # the exchange's counters, the ticket
    _chunk_scan_kernel[(batch * H * tiles,)](
        px, pB, pC, pdt, read_hi, folds, A, hi, lo, pre, y, checkpoint, keys, out, g_lo, exch, count, count[-1:],
        *res, S, span[0], span[1], first, out.shape[1], L, H, P, N, G, H // G, tiles, float(skip or 0.0),
        **recur.constexprs("RECUR"), **read.constexprs("READ"), RECUR_EF=int(recur.ef), READ_EF=int(read.ef),
        SHARED=config.shared, LO_OUTSIDE=outside is not None, SKIP=skip is not None, BUF=buffer_kind(config),
        PROGRAMS=programs, BLOCK_L=window_rows(L), BLOCK_P=block_p, BLOCK_N=block_n,
        CHUNK_N=min(CHUNK_COLUMNS, block_n),
        DOT=launch["DOT"], READ_DOT=launch["READ_DOT"], num_warps=launch["num_warps"], maxnreg=launch["maxnreg"],
    )


def chunked_launch_config(head_dim: int, d_state: int, whole_head: bool) -> dict:
    """BLOCK_P (head_dim rows per program: PROGRAM_ROWS, or the whole head for scale groups spanning more rows: head
    scales, tall scale tiles, groups, blocks and rotation runs along head_dim), num_warps, DOT (the fold's tl.dot
    input_precision), READ_DOT (the segment's reads over d_state) and maxnreg of `_chunk_scan_kernel`
    (benchmarks/layer_speed.py sweeps them). The fold stays in FP32 FMAs ("ieee"), so the stored copies keep their
    bits; the reads' "tf32x3" products (three TF32 tensor-core products, FP32-level error: the outputs moved by at
    most 6e-7 of their largest) ran 1.4x faster per layer on the H200 (BENCHMARKS.md, Chunked form)."""
    if whole_head:  # the sweep's best on the H200 at P = 80, N = 128 (reports/layer_speed.json)
        return {"BLOCK_P": max(16, triton.next_power_of_2(head_dim)), "num_warps": 16, "DOT": "ieee",
                "READ_DOT": "tf32x3", "maxnreg": None}
    return {"BLOCK_P": PROGRAM_ROWS, "num_warps": 2, "DOT": "ieee", "READ_DOT": "tf32x3", "maxnreg": None}


def _codecs(config, dims: tuple[int, int]) -> tuple:
    """The codecs of (S_hi, S_lo) the loop rounds (`tile_codec`: a program holds the whole head where a scale needs it;
    dims: the state's (head_dim, d_state)), None for a copy torch rounds; a shared checkpoint's S_lo is S_hi."""
    return tile_codec(config.recur_format, dims=dims), tile_codec(config.read_format, dims=dims)


def _launched(codecs: tuple) -> tuple[KernelCodec, KernelCodec]:
    """The codecs `_scan` launches with for the in-loop codecs (S_hi's, S_lo's; None where torch rounds the copy): an
    FP32 fold for a copy torch rounds."""
    return tuple(c or FP32_CODEC for c in codecs)


def runs_in_phases(config, dims: tuple[int, int]) -> bool:
    """Whether a call of `config` on states of dims (head_dim, d_state) runs in `triton_phases`' phases (a head-scaled
    read copy beside a recurrence copy the loop rounds or torch does), else in the one loop. A read copy with error
    feedback takes the one loop: the phases round the read copies with head amaxes of the folds, not of fold plus
    residual (the fold chain carries the recurrence copy's residual)."""
    return READ_COPY not in feedback_copies(config) and phased(_launched(_codecs(config, dims)), config.shared)


def feedback_in_kernel(config, dims: tuple[int, int]) -> bool:
    """Whether the chunked kernels carry the error-feedback residuals of a call of `config` on states of dims
    (head_dim, d_state): every copy that keeps one (`ef=`) rounds in the loop (a copy torch rounds between launches or
    after the kernel would need its residual there; `replay.state.chunked_backend` then runs the torch backend)."""
    return carries_feedback(_codecs(config, dims), config)


def token_scan_rows(config, dims: tuple[int, int], length: int, device: torch.device) -> int | None:
    """head_dim rows per program of `triton_tokens`' scan for a call of `config` on states of dims (head_dim, d_state)
    on device whose segments hold at most `length` entries (one: window 1, or one-draft steps), None where the call
    runs in the one loop or the phases."""
    if length != 1:
        return None
    recur, read = _codecs(config, dims)
    exchange = can_exchange(triton.cdiv(dims[0], PROGRAM_ROWS), device)  # a head's programs of PROGRAM_ROWS at once
    return token_rows((recur,) if config.shared else (recur, read), dims[0], exchange)


def _scan(grid, A, hi, lo, pre, res, y, inp: Inputs, seg, keys, codecs, span, phases, outside=None) -> None:
    """`_chunk_scan` over span. A recurrence copy the loop cannot round (codecs[0] None) takes one launch per segment
    that keeps the FP32 fold in S_hi, which `round_folded` rounds for the sequences that folded before the next
    launch (exactly `write_checkpoint`'s rounding; a shared checkpoint's S_lo is the same tensor)."""
    state, config = inp.state, inp.config
    checkpoint = state.checkpoint.contiguous()
    recur, read = codecs
    if recur is not None:
        _chunk_scan(grid, A, hi, lo, pre, res, y, checkpoint, keys, config, codecs, span, phases, outside)
        return
    for s in range(*span):
        _chunk_scan(grid, A, hi, lo, pre, res, y, checkpoint, keys, config, _launched(codecs), (s, s + 1), phases,
                    outside)
        round_folded(hi, config.recur_format, keys[:, 0], checkpoint + s + 1, seg.folds[:, s], seg.folds_host[s])


def _read_outside(grid, A, hi, pre, res, y, inp: Inputs, seg, keys, recur) -> None:
    """Split config whose read format the loop cannot round (tensor scale, non-power-of-two tiles, no kernel codec):
    exact in two passes, because S_lo never feeds the fold. Per block of segments: (1) the kernel reads S_hi only,
    rounds S_hi (`_scan`) and stores every FP32 fold; (2) torch rounds the block's folds to S_lo at once
    (`write_read_copy_packed`'s encoding, keys and checkpoint indices); (3) the tokens that read S_lo add
    g_read C . S_lo. hi, pre and y are updated in place.

    Memory: the folds of a block, B * (K + 1) * H * P * N fp32 with B * K * H * P * N <= _FOLD_BLOCK_ELEMENTS (K >= 1),
    and the encoder's temporaries for them."""
    px, pC = grid[0], grid[2]
    batch, S, L, H, P = px.shape
    N = pC.shape[-1]
    state, config = inp.state, inp.config
    block = max(1, _FOLD_BLOCK_ELEMENTS // (batch * H * P * N))
    out = torch.empty(batch, min(block, S) + 1, H, P, N, dtype=torch.float32, device=px.device)
    out[:, 0] = state.lo  # slot 0: the read copy of the block's first segment; slot k + 1: S_lo after segment s0 + k
    g_lo = torch.empty(batch, S, L, H, dtype=torch.float32, device=px.device)
    for s0 in range(0, S, block):
        s1 = min(S, s0 + block)
        k = s1 - s0
        _scan(grid, A, hi, hi, pre, res, y, inp, seg, keys, (recur, FP32_CODEC), (s0, s1), None,
              outside=(out, g_lo, s0))
        fold = seg.folds[:, s0:s1]  # [B, k]
        if any(any(f) for f in seg.folds_host[s0:s1]):
            new = out[:, 1:k + 1]  # [B, k, H, P, N]
            checkpoint = state.checkpoint[:, None] + torch.arange(s0 + 1, s1 + 1, device=px.device)  # [B, k]
            read_keys = keys[:, None, 1].expand(-1, k)  # [B, k]
            packed = encode_keyed(new[fold], config.read_format, read_keys[fold], checkpoint[fold])
            new[fold] = config.read_format.decode(packed)
        Ch = group_heads(pC[:, s0:s1], H)  # [B, k, L, H, N]
        y[:, s0:s1] += g_lo[:, s0:s1, ..., None] * torch.einsum("bkhpn,bklhn->bklhp", out[:, :k], Ch)
        out[:, 0] = out[:, k]


def chunked_triton_prepared(inp: Inputs, plan: TokenPlan, after) -> tuple[torch.Tensor, ReplayState]:
    """`chunked(..., backend="triton")` after `prepare_inputs` and planning."""
    if inp.x.dtype != torch.float32:
        warnings.warn("mamba2 chunked backend='triton' runs the torch backend: the Triton kernels compute in FP32 "
                      "(compute_dtype=float64 runs the torch backend)", stacklevel=3)
        return chunked_torch(inp, plan, after)
    batch, tokens, heads, head_dim, groups, d_state = inp.dims
    state, config = inp.state, inp.config
    if tokens == 0:
        return chunked_torch(inp, plan, after)
    seg = Segments(inp, plan)
    to_grid = lambda t: t.view(batch, seg.segments, seg.length, *t.shape[2:]).contiguous()  # noqa: E731
    grid = (to_grid(seg.pad(inp.x, state.buffer["x"])), to_grid(seg.pad(inp.B, state.buffer["B"])),
            to_grid(seg.pad(inp.C, None)), to_grid(seg.pad(inp.dt, state.buffer["dt"])),
            to_grid(seg.read_hi).to(torch.int8), seg.folds.to(torch.int8).contiguous())
    keys = torch.stack([sr_keys(config.seed, state.layer, state.seq_ids, RECUR_COPY),
                        sr_keys(config.seed, state.layer, state.seq_ids, READ_COPY)], 1).contiguous()  # [B, 2]
    hi = state.hi.clone().contiguous()
    pre = torch.zeros_like(hi)
    y_grid = torch.empty(*grid[0].shape, dtype=torch.float32, device=hi.device)  # [B, S, L, H, P]
    recur, read = _codecs(config, (head_dim, d_state))
    A = inp.A.contiguous()
    read_outside = read is None and not config.shared
    rows = token_scan_rows(config, (head_dim, d_state), seg.length, hi.device)
    in_phases = rows is None and runs_in_phases(config, (head_dim, d_state))
    lo_by_torch = read_outside or in_phases  # the last S_lo from torch (the phases round it for the segments' reads)
    lo = hi if config.shared else state.lo.clone().contiguous()  # updated in place where the loop rounds it
    # error-feedback residuals (`feedback_in_kernel`: of copies the kernels round), updated in place; the packed
    # copy's residual before the newest fold, for its encoding below
    residual = {copy: t.contiguous() for copy, t in state.residual.items()}
    packed_copy = RECUR_COPY if config.shared else READ_COPY
    res = (residual.get(RECUR_COPY, hi), residual.get(READ_COPY, hi),
           torch.zeros_like(hi) if packed_copy in residual else hi)
    packed_residual = lambda index: {packed_copy: res[2][index]} if packed_copy in residual else None  # noqa: E731
    if read_outside:
        _read_outside(grid, A, hi, pre, res, y_grid, inp, seg, keys, recur)
    elif rows is not None:  # one-token windows whose copies round in 16-row programs: the state in registers
        scan_tokens(grid, A, hi, lo, pre, res, y_grid, state.checkpoint.contiguous(), keys, config,
                    _launched((recur, read)), rows)
    else:
        phases = PhaseState(seg.num_folds, seg.segments, heads) if in_phases else None
        _scan(grid, A, hi, lo, pre, res, y_grid, inp, seg, keys, (recur, read), (0, seg.segments), phases)
    y = torch.gather(y_grid.view(batch, -1, heads, head_dim), 1, seg.index[..., None, None].expand(-1, -1, heads, head_dim))
    y = y + inp.D[:, None] * inp.x_skip
    packed = state.lo_packed
    rows = [b for b, folds in enumerate(seg.folds_host[0]) if folds]  # sequences that wrote a checkpoint
    if len(rows) == batch:  # no selection: seq_ids stays the tensor whose keys `sr_keys` remembers
        new_lo, packed = write_read_copy_packed(pre, config, state.layer, state.seq_ids,
                                                state.checkpoint + seg.num_folds, packed_residual(slice(None)))
        if lo_by_torch:
            lo = new_lo
    elif rows:
        index = torch.tensor(rows).to(hi.device, non_blocking=True)
        new_lo, new_packed = write_read_copy_packed(pre[index], config, state.layer, state.seq_ids[index],
                                                    (state.checkpoint + seg.num_folds)[index], packed_residual(index))
        packed = merge_packed(packed, new_packed, index, batch)
        if lo_by_torch:
            lo[index] = new_lo
    buffer = seg.new_buffers({"x": inp.x, "B": inp.B, "dt": inp.dt}, state.buffer, after.count)
    out = ReplayState(hi, lo, buffer, after, state.checkpoint + seg.num_folds, state.seq_ids, state.layer, packed,
                      residual)
    return y.to(inp.out_dtype), out

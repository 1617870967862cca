"""Triton versions of the state formats' encoders: `encode_triton` and `quantize_triton`, kernels on `device`.

`encode_triton(x, fmt, keys, checkpoint)` equals `fmt.encode` field by field (the packed checkpoint a
flush writes; Philox keyed per state as `replay.keys`), in one launch after any group reduction, for every format
with a `kernel_codec`.
`quantize_triton(x, fmt, ...)` equals `fmt.quantize(x, ...)` bit for bit (not for dual-axis factors, which only
whole-head programs round: `device.round_tile`). Both read the format's
`kernel_codec` only (fp16sr's word layouts and conversions, and the SR formats' `rounds=` and `bits=`, included).
Group amax reductions over more than a row (FP8 and integer head/tensor/tile scales, NVFP4 global scales) run before
the launch, in torch (`encode_triton`'s head scales in one amax launch of their own, `head_amax`), as do scale=rowcol's
column factors (the kernels round x / c by rows and multiply c back); row maxima, block maxima, scales, rounding and
Philox (`tl.randint(seed, offset + flat index, rounds)`, or the word layout's `tl.randint4x` calls:
`device.seeded_bits`) run in the kernel. A rotation (`rot=`) runs in torch before the kernel (`rotation.rotate_runs`),
and after it in torch (`quantize_triton`) or in the kernel (`encode_triton`'s decoded copy: `device.hadamard_tile`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.formats import layout
from replayssm_eval.formats.codec import Group, KernelCodec, Kind, Order
from replayssm_eval.formats.device import (
    AXIS_HEADDIM, BF16, FP8, FP8E5M2, FP8SR, FP16, FP16SR, FP16SR_SOFT, GROUP_NONE, GROUP_ROW, GROUP_ROWCOL, GROUP_TILE,
    INT8, INT8SR, INT16, INT16SR, MX8, MX8SR, MXFP4, MXFP8, NVFP4, ORDER_MUL, e2m1_encode, e4m3_encode, e5m2_encode,
    hadamard_tile, magnitudes, mx_elements, mx8_bytes, mx8_codes, mx8_values, nvfp4_tile, pair_odd, quantize_tile,
    round_kind, row_amax, scale_elements, seeded_bits, sr_field, state_bits,
)
from replayssm_eval.formats.formats import StateFormat, column_factors
from replayssm_eval.formats.packed import PackedState
from replayssm_eval.formats.rotation import rotate_runs, rotate_state
from replayssm_eval.formats.triton_dual_axis import launch_dual_axis_encode, packed_bytes

_NO_BITS, _BITS_GIVEN, _BITS_PHILOX = map(tl.constexpr, range(3))  # SOURCE: where quantize_triton's words come from
TAKE_SLOTS = 16  # `encode_triton(take=)`: programs per row block; program s takes taken states s, s + 16, ...


# a seed or offset of 1 stays a run-time integer: compiled Triton passes an integer argument equal to 1 as a constant
# (which has no .to()); the interpreter does not
@triton.jit(do_not_specialize=["seed", "offset"])
def _quantize_kernel(
    x_ptr, y_ptr, amax_ptr, bits_ptr, seed, offset, n_rows, n_cols,
    KIND: tl.constexpr, GROUP: tl.constexpr, MAX: tl.constexpr, ORDER: tl.constexpr, RANDOM: tl.constexpr,
    SOURCE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # x, y: [n_rows, n_cols] FP32 (oriented rows); amax: [n_rows] group amax of each row's scale group, or
    # [n_rows, n_cols] each element's (GROUP_TILE); bits: [n_rows, n_cols] one word per element (SOURCE _BITS_GIVEN),
    # read through RANDOM's word layout and bits
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    idx = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    x = tl.load(x_ptr + idx, mask=mask, other=0.0)  # [BLOCK_R, BLOCK_C]
    bits = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.uint32)
    if SOURCE == _BITS_GIVEN:
        odd = pair_odd(cols[None, :], RANDOM[0])  # the element 2j+1 of a pair reads 2j's word
        bits = sr_field(tl.load(bits_ptr + idx - odd, mask=mask, other=0) >> (odd * 16), KIND, RANDOM[2])
    elif SOURCE == _BITS_PHILOX:
        bits = seeded_bits(seed, offset.to(tl.int64) + idx, cols[None, :], KIND, RANDOM)
    if GROUP == GROUP_TILE:
        amax = tl.load(amax_ptr + idx, mask=mask, other=1.0)  # [BLOCK_R, BLOCK_C]
    else:
        amax = tl.load(amax_ptr + rows, mask=rows < n_rows, other=1.0)[:, None]  # [BLOCK_R, 1]
    y = quantize_tile(x, bits, amax, KIND, GROUP, MAX, ORDER, BLOCK_R, BLOCK_C)
    tl.store(y_ptr + idx, y, mask=mask)


def _group_amax(xo: torch.Tensor, codec: KernelCodec) -> torch.Tensor:
    """amax `[B, H|1, R|1, 1]` of each global scale group of the oriented xo `[B, H, R, C]` (scale=rowcol: of x / c,
    by rows), NaN read as codec.order reads it."""
    scale = "row" if codec.group == Group.ROWCOL else codec.group.scale
    return layout.group_amax(xo, scale, skip_nan=codec.order == Order.MUL)


def _row_amax(xo: torch.Tensor, codec: KernelCodec) -> torch.Tensor | None:
    """Per-row amax of the row's global scale group, `[B*H*R]` (per element, `[B*H*R*C]`, for scale tiles), or None
    when the format has none."""
    if codec.group == Group.NONE:
        return None
    if codec.group == Group.TILE:
        r, c = xo.shape[-2:]
        rows, cols = codec.rows or r, codec.cols or c
        tmax = layout.tile_max(layout.magnitudes(xo, codec.order == Order.MUL), rows, cols)  # [B, H, Rt, Ct]
        return layout.untile(tmax, rows, cols, r, c).reshape(-1).contiguous()
    return _group_amax(xo, codec).expand(*xo.shape[:3], 1).reshape(-1).contiguous()


def quantize_triton(x: torch.Tensor, fmt: StateFormat, *, seed: int | None = None, offset: int = 0,
                    random_bits: torch.Tensor | None = None) -> torch.Tensor:
    """`fmt.quantize(x, ...)` computed by one Triton kernel; identical bits."""
    codec = fmt.kernel_codec
    if codec is None:
        raise NotImplementedError(f"quantize_triton does not cover format '{fmt.name}' (it has no `kernel_codec`)")
    if codec.group == Group.DUAL:
        raise NotImplementedError(f"quantize_triton does not cover format '{fmt.name}': its dual-axis factors span a "
                                  "whole head, which the chunked kernels' whole-head programs round (`tile_codec`)")
    xo = layout.orient(layout.as_bhpn(x), codec.axis).contiguous()  # [B, H, R, C]
    if codec.rot > 1:
        xo = rotate_runs(xo, codec.rot, codec.axis)
    col = column_factors(xo) if codec.group == Group.ROWCOL else None  # [B, H, 1, C]
    if col is not None:
        xo = xo / col
    n_cols = xo.shape[-1]
    n_rows = xo.numel() // max(n_cols, 1)
    mode = _NO_BITS
    bits = xo
    if fmt.is_stochastic:
        if random_bits is not None or codec.axis == "headdim":  # Philox counters run over x's own layout
            # raises the missing-seed error
            words = layout.random_words(x, seed, offset, random_bits, codec.rounds, fmt.lane_words)
            bits = layout.orient(words.reshape(layout.as_bhpn(x).shape), codec.axis).contiguous()
            mode = _BITS_GIVEN
        elif seed is None:
            layout.random_words(x, seed, offset, None)  # raises the missing-seed error
        else:
            mode = _BITS_PHILOX
    amax = _row_amax(xo, codec)
    block_c = min(max(triton.next_power_of_2(n_cols), codec.block), 1024)
    block_r = max(1, min(64, 2048 // block_c))
    y = torch.empty_like(xo)
    if xo.numel():
        grid = (triton.cdiv(n_rows, block_r), triton.cdiv(n_cols, block_c))
        _quantize_kernel[grid](
            xo, y, xo if amax is None else amax, bits, int(seed or 0), int(offset), n_rows, n_cols,
            *codec.args, RANDOM=codec.random, SOURCE=mode.value, BLOCK_R=block_r, BLOCK_C=block_c,
        )
    if col is not None:
        y = y * col
    if codec.rot > 1:
        y = rotate_runs(y, codec.rot, codec.axis)
    return layout.unorient(y, codec.axis).reshape(x.shape).to(x.dtype)


@triton.jit
def _encode_kernel(
    x_ptr, data_ptr, scales_ptr, gs_ptr, cs_ptr, amax_ptr, col_ptr, key_ptr, ck_ptr, take_ptr, dec_ptr, n_seq,
    n_rows, n_cols, head_rows, group_rows, tile_rows, tile_cols,
    KIND: tl.constexpr, GROUP: tl.constexpr, MAX: tl.constexpr, ORDER: tl.constexpr, RANDOM: tl.constexpr,
    AXIS: tl.constexpr, ROT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, TAKE: tl.constexpr,
    BLOCK_B: tl.constexpr, DECODED: tl.constexpr,
):
    # x: [B, H, P, N] FP32, read as the oriented rows [B, n_rows, n_cols] (n_rows = H * R, `_encode_rows`); program
    # (s, t) encodes row block t (BLOCK_R whole rows) of sequence s, or, TAKE, of the taken sequences s, s + S,
    # s + 2 S, ... in order (S programs on axis 0); take: [B] int8, TAKE: only sequences with take[b] != 0 are read
    # and written (B = n_seq <= BLOCK_B)
    if TAKE:  # the grid's size does not depend on how many states are taken (a CUDA graph replays it)
        seqs = tl.arange(0, BLOCK_B)
        taken = (tl.load(take_ptr + seqs, mask=seqs < n_seq, other=0) != 0).to(tl.int32)
        rank = tl.cumsum(taken, axis=0) - 1  # [BLOCK_B] place of each taken state among them
        n_taken = tl.sum(taken, axis=0)
        k = tl.program_id(0)
        while k < n_taken:  # a while loop: the interpreter cannot take range() of a runtime scalar
            b = tl.sum(tl.where((taken != 0) & (rank == k), seqs, 0), axis=0)
            _encode_rows(x_ptr, data_ptr, scales_ptr, gs_ptr, cs_ptr, amax_ptr, col_ptr, key_ptr, ck_ptr, dec_ptr, b,
                         n_rows, n_cols, head_rows, group_rows, tile_rows, tile_cols, KIND, GROUP, MAX, ORDER, RANDOM,
                         AXIS, ROT, BLOCK_R, BLOCK_C, DECODED)
            k += tl.num_programs(0)
    else:
        _encode_rows(x_ptr, data_ptr, scales_ptr, gs_ptr, cs_ptr, amax_ptr, col_ptr, key_ptr, ck_ptr, dec_ptr,
                     tl.program_id(0), n_rows, n_cols, head_rows, group_rows, tile_rows, tile_cols, KIND, GROUP, MAX,
                     ORDER, RANDOM, AXIS, ROT, BLOCK_R, BLOCK_C, DECODED)


@triton.jit
def _encode_rows(
    x_ptr, data_ptr, scales_ptr, gs_ptr, cs_ptr, amax_ptr, col_ptr, key_ptr, ck_ptr, dec_ptr, b, n_rows, n_cols,
    head_rows, group_rows, tile_rows, tile_cols, KIND: tl.constexpr, GROUP: tl.constexpr, MAX: tl.constexpr,
    ORDER: tl.constexpr, RANDOM: tl.constexpr, AXIS: tl.constexpr, ROT: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr, DECODED: tl.constexpr,
):
    """Encode row block program_id(1) of sequence b: rows of the oriented view [H * R, C] (head_rows = R; AXIS_HEADDIM:
    row r of a head is its d_state index r, read with stride R along head_dim), x already rotated (ROT > 1: the
    decoded copy is rotated back here). amax: [B * n_rows // group_rows] (head and tensor groups, reduced by torch),
    or each scale tile's (GROUP_TILE: tiles of tile_rows x tile_cols of a head's group_rows rows, `_tile_index`),
    which the tile's first element stores in scales; col: [B * H * C] scale=rowcol's column factors (torch's), which
    each head's first row stores in cs; key, ck: [B] Philox key and checkpoint (SR kinds, their words read through
    RANDOM's word layout and bits); dec: [B, H, P, N] FP32, DECODED: the decoded value is stored there too.
    Element codes and decoded values lie in the state's layout, packed rows (NVFP4, MX) and scales in the oriented."""
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols[None, :] < n_cols)
    head = rows // head_rows  # [BLOCK_R]
    if AXIS == AXIS_HEADDIM:  # [BLOCK_R, BLOCK_C] index in [H, P, N] of oriented element (r, c): (c, r) of the head
        elem = (head.to(tl.int64) * head_rows * n_cols + rows % head_rows)[:, None] + cols[None, :] * head_rows
        col = (rows % head_rows)[:, None]  # [BLOCK_R, 1] the elements' index along the state's last dim
    else:
        elem = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        col = cols[None, :]  # [1, BLOCK_C]
    row_g = b.to(tl.int64) * n_rows + rows  # [BLOCK_R] row of [B * H * R]
    x = tl.load(x_ptr + b.to(tl.int64) * n_rows * n_cols + elem, mask=mask, other=0.0)
    dec = dec_ptr + b.to(tl.int64) * n_rows * n_cols  # this state's decoded copy (`_store_decoded` at elem)
    factor = tl.full((BLOCK_R, BLOCK_C), 1.0, tl.float32)
    if GROUP == GROUP_ROWCOL:  # x / c by the head's column factors; the head's first row stores them
        at = (b.to(tl.int64) * n_rows // head_rows + head)[:, None] * n_cols + cols[None, :]
        factor = tl.load(col_ptr + at, mask=mask, other=1.0)  # [BLOCK_R, BLOCK_C]
        tl.store(cs_ptr + at, factor, mask=mask & (rows % head_rows == 0)[:, None])
        x = tl.math.div_rn(x, factor)
    bits = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.uint32)
    if (KIND == FP16SR) | (KIND == FP16SR_SOFT) | (KIND == FP8SR) | (KIND == INT8SR) | (KIND == INT16SR) | (
            KIND == MX8SR):
        # key and checkpoint: SR kinds only
        bits = state_bits(tl.load(key_ptr + b), (tl.load(ck_ptr + b) << 32) + elem, col, KIND, RANDOM,
                          AXIS != AXIS_HEADDIM)  # along head_dim: rows of several heads, their groups unaligned
    group = row_g // group_rows  # [BLOCK_R] global scale group
    amax = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    if (GROUP == GROUP_ROW) | (GROUP == GROUP_ROWCOL):
        amax = row_amax(x, mask, ORDER)
    elif GROUP == GROUP_TILE:
        tile = _tile_index(row_g, cols, group_rows, n_cols, tile_rows, tile_cols)
        amax = tl.load(amax_ptr + tile, mask=mask, other=1.0)  # [BLOCK_R, BLOCK_C]
    elif GROUP != GROUP_NONE:
        amax = tl.load(amax_ptr + group, mask=row_ok, other=1.0)[:, None]
    first = row_ok & (row_g % group_rows == 0)  # the row that stores its group's global scale
    if KIND == NVFP4:
        q, s_b, s_dec = nvfp4_tile(x, amax, BLOCK_R, BLOCK_C)
        codes = tl.reshape(e2m1_encode(q), (BLOCK_R, BLOCK_C // 2, 2))
        lo, hi = tl.split(codes)  # elements 2j, 2j + 1
        n_bytes = (n_cols + 15) // 16 * 8
        j = tl.arange(0, BLOCK_C // 2)
        tl.store(data_ptr + row_g[:, None] * n_bytes + j[None, :], (lo | (hi << 4)).to(tl.uint8),
                 mask=row_ok[:, None] & (j[None, :] < n_bytes))
        k = tl.arange(0, BLOCK_C // 16)
        tl.store(scales_ptr + row_g[:, None] * (n_bytes // 8) + k[None, :], e4m3_encode(s_b).to(tl.uint8),
                 mask=row_ok[:, None] & (k[None, :] < n_bytes // 8))
        tl.store(gs_ptr + group[:, None], s_dec, mask=first[:, None])
        if DECODED:
            y = tl.reshape((q * s_b[:, :, None]) * s_dec[:, :, None], (BLOCK_R, BLOCK_C))
            _store_decoded(dec + elem, y, factor, mask, GROUP, ROT, BLOCK_R, BLOCK_C)
    elif (KIND == MXFP8) | (KIND == MXFP4):  # E4M3 bytes or E2M1 nibbles of the row padded to blocks of 32
        q, scale, code = mx_elements(x, KIND, BLOCK_R, BLOCK_C)  # [BLOCK_R, NB, 32], [BLOCK_R, NB], alike
        n_padded = (n_cols + 31) // 32 * 32
        if KIND == MXFP8:
            tl.store(data_ptr + row_g[:, None] * n_padded + cols[None, :],
                     tl.reshape(e4m3_encode(q), (BLOCK_R, BLOCK_C)).to(tl.uint8),
                     mask=row_ok[:, None] & (cols[None, :] < n_padded))
        else:
            lo, hi = tl.split(tl.reshape(e2m1_encode(q), (BLOCK_R, BLOCK_C // 2, 2)))  # elements 2j, 2j + 1
            j = tl.arange(0, BLOCK_C // 2)
            tl.store(data_ptr + row_g[:, None] * (n_padded // 2) + j[None, :], (lo | (hi << 4)).to(tl.uint8),
                     mask=row_ok[:, None] & (j[None, :] < n_padded // 2))
        k = tl.arange(0, BLOCK_C // 32)
        tl.store(scales_ptr + row_g[:, None] * (n_padded // 32) + k[None, :], code.to(tl.uint8),
                 mask=row_ok[:, None] & (k[None, :] < n_padded // 32))
        if DECODED:
            y = tl.reshape(q * scale[:, :, None], (BLOCK_R, BLOCK_C))
            _store_decoded(dec + elem, y, factor, mask, GROUP, ROT, BLOCK_R, BLOCK_C)
    elif (KIND == MX8) | (KIND == MX8SR):  # a byte per element of the row padded to whole blocks of 16
        n_bytes = (n_cols + 15) // 16 * 16
        m, neg, mu, big, bad = mx8_codes(x, bits, KIND == MX8SR, BLOCK_R, BLOCK_C)
        tl.store(data_ptr + row_g[:, None] * n_bytes + cols[None, :],
                 mx8_bytes(m, neg, mu, big, bad, BLOCK_R, BLOCK_C).to(tl.uint8),
                 mask=row_ok[:, None] & (cols[None, :] < n_bytes))
        if DECODED:
            y = mx8_values(m, neg, mu, big, bad, BLOCK_R, BLOCK_C)
            _store_decoded(dec + elem, y, factor, mask, GROUP, ROT, BLOCK_R, BLOCK_C)
    else:
        v, s = scale_elements(x, amax, KIND, GROUP, MAX, ORDER)
        if GROUP == GROUP_TILE:  # a tile's scale from its first element
            corner = mask & ((row_g % group_rows) % tile_rows == 0)[:, None] & (cols % tile_cols == 0)[None, :]
            tl.store(scales_ptr + tile, s, mask=corner)
        elif GROUP != GROUP_NONE:
            tl.store(gs_ptr + group[:, None], s, mask=first[:, None])
        q = round_kind(v, bits, KIND)
        if DECODED:  # the decoded element is q, on the format's grid, times the scale
            _store_decoded(dec + elem, q * s if GROUP != GROUP_NONE else q, factor, mask, GROUP, ROT, BLOCK_R, BLOCK_C)
        out = data_ptr + b.to(tl.int64) * n_rows * n_cols + elem
        if (KIND == FP8) | (KIND == FP8SR):
            tl.store(out, e4m3_encode(q).to(tl.uint8), mask=mask)
        elif KIND == FP8E5M2:
            tl.store(out, e5m2_encode(q).to(tl.uint8), mask=mask)
        elif KIND == BF16:  # the high half of the rounded FP32 (data viewed as int16)
            tl.store(out, (q.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)
        elif (KIND == FP16) | (KIND == FP16SR) | (KIND == FP16SR_SOFT):
            tl.store(out, q.to(tl.float16), mask=mask)  # exact: q is on the FP16 grid
        elif (KIND == INT8) | (KIND == INT8SR):
            tl.store(out, q.to(tl.int8), mask=mask)  # exact: q is an integer code within +-127
        elif (KIND == INT16) | (KIND == INT16SR):
            tl.store(out, q.to(tl.int16), mask=mask)
        else:
            tl.store(out, q, mask=mask)


@triton.jit
def _store_decoded(ptr, y, factor, mask, GROUP: tl.constexpr, ROT: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_C: tl.constexpr):
    """Store the decoded oriented tile y [BLOCK_R, BLOCK_C] at ptr: times scale=rowcol's column factors, rotated back
    (ROT > 1), as `fmt.decode` orders them."""
    if GROUP == GROUP_ROWCOL:
        y = y * factor
    if ROT > 1:
        y = hadamard_tile(y, ROT, BLOCK_R, BLOCK_C)
    tl.store(ptr, y, mask=mask)


@triton.jit
def _tile_index(row_g, cols, head_rows, n_cols, tile_rows, tile_cols):
    """[BLOCK_R, BLOCK_C] index in the flat [B, H, Rt, Ct] scale tiles of each element (row_g: [BLOCK_R] row of
    [B * H * head_rows]; cols: [BLOCK_C] column) under tiles of tile_rows x tile_cols (edge tiles shorter)."""
    n_tr = (head_rows + tile_rows - 1) // tile_rows
    n_tc = (n_cols + tile_cols - 1) // tile_cols
    row_tile = row_g // head_rows * n_tr + row_g % head_rows // tile_rows  # [BLOCK_R] the head's tile row
    return row_tile[:, None] * n_tc + (cols // tile_cols)[None, :]


@triton.jit
def _head_amax_kernel(x_ptr, amax_ptr, take_ptr, heads, GROUP_ELEMS: tl.constexpr, TAKE: tl.constexpr,
                      ORDER: tl.constexpr, BLOCK: tl.constexpr):
    # x: [B * heads, GROUP_ELEMS] FP32, one program per head; amax: [B * heads] max |x| as `layout.group_amax` reads
    # it (ORDER_DIV: NaN if any element is NaN, as torch's amax; ORDER_MUL: NaN skipped, from -FLT_MAX);
    # take: [B] int8, TAKE: heads of sequences with take[b] == 0 are neither read nor written
    g = tl.program_id(0)
    if TAKE:
        if tl.load(take_ptr + g // heads) == 0:
            return
    base = x_ptr + g.to(tl.int64) * GROUP_ELEMS
    best = tl.zeros((BLOCK,), dtype=tl.float32)  # the maximum of no element: 0, or -FLT_MAX (ORDER_MUL)
    if ORDER == ORDER_MUL:
        best = magnitudes(best + float("nan"), ORDER)
    nan = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, GROUP_ELEMS, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < GROUP_ELEMS
        a = tl.where(inside, magnitudes(tl.load(base + offs, mask=inside, other=0.0), ORDER), best)  # padding: best
        nan = nan | (a != a).to(tl.int32)
        best = tl.maximum(best, tl.where(a != a, 0.0, a))
    amax = tl.max(best, axis=0)
    tl.store(amax_ptr + g, tl.where(tl.max(nan, axis=0) != 0, float("nan"), amax))


def head_amax(x4: torch.Tensor, take: torch.Tensor | None = None, skip_nan: bool = False) -> torch.Tensor:
    """max |x| per head of a contiguous `[B, H, P, N]` FP32 state, `[B * H]`, in one launch (no |x| temporary);
    NaN where a head holds one, unless skip_nan (NaN read as -FLT_MAX: `layout.magnitudes`). take: [B] bool, only
    those sequences' heads are read and written (the others are left undefined)."""
    n_seq, h = x4.shape[:2]
    group_elems = x4[0, 0].numel()
    amax = torch.empty(n_seq * h, dtype=torch.float32, device=x4.device)
    if amax.numel() and group_elems:
        block = min(2048, triton.next_power_of_2(group_elems))
        _head_amax_kernel[(n_seq * h,)](x4, amax, x4 if take is None else take.to(torch.int8), h,
                                        GROUP_ELEMS=group_elems, TAKE=take is not None,
                                        ORDER=int(Order.MUL if skip_nan else Order.DIV), BLOCK=block)
    return amax


def encode_triton(x: torch.Tensor, fmt: StateFormat, keys: torch.Tensor | None = None,
                  checkpoint: torch.Tensor | None = None, *, take: torch.Tensor | None = None,
                  out: PackedState | None = None, decoded: torch.Tensor | None = None) -> PackedState:
    """`fmt.encode` of a state x `[..., H, P, N]` in one kernel launch; every field bit-identical.

    For stochastic formats keys and checkpoint ([B] int64, B = number of leading indices) give each
    state's Philox key and checkpoint index, and the result equals
    `fmt.encode(x, random_bits=replay.keys.state_random_bits(keys, checkpoint, (H, P, N), fmt.lane_words))`;
    deterministic formats ignore them and equal `fmt.encode(x)`. Every format with a `kernel_codec`: either axis (the
    kernel reads the oriented rows in place), every scale, `rot=`. Head scales take one amax launch first (of the
    `take` rows only); a state's tensor-wide scale one torch amax reduction, scale tiles one torch tile maximum and
    scale=rowcol one torch column maximum (of every state); row scales are reduced in the kernel. A rotation (`rot=`)
    rotates the state in torch before (`rotation.rotate_state`) and the decoded copy in the kernel
    (`device.hadamard_tile`, the same bits). Dual-axis factors take one program per head (`triton_dual_axis`).

    In place, for a flush that rounds some sequences only: out: a PackedState of this format and
    shape whose contiguous fields are written instead of new ones; decoded: a contiguous FP32 tensor
    of x's shape that receives `fmt.decode` of the result; take: [B] bool, only those states are read
    and written (every scale group lies within a state), by `TAKE_SLOTS` programs per row block that take
    them in turn: the grid does not grow with B nor depend on how many are taken.
    """
    codec = fmt.kernel_codec
    if codec is None:
        raise NotImplementedError(f"encode_triton does not cover format '{fmt.name}': it has no `kernel_codec`")
    x4 = layout.as_bhpn(x).contiguous()  # [B, H, P, N]
    if codec.rot > 1:  # the rotated state, in the state's layout
        x4 = rotate_state(x4, codec.rot, codec.axis).contiguous()
    shape = tuple(x.shape)
    group = codec.group
    if group == Group.DUAL:
        return _encode_dual_axis(x4, fmt, codec, shape, take, out, decoded)
    n_seq = x4.shape[0]
    *lead, h, r, c = layout.oriented_shape(shape, codec.axis)  # the oriented head [R, C]: codes along C
    fields = {"data": None, "scales": None, "global_scale": None, "col_scale": None}  # name: (shape, dtype)
    if codec.block == 1:  # element codes in the state's layout
        fields["data"] = shape, codec.data_dtype
    elif codec.kind in (Kind.MX8, Kind.MX8SR):  # a byte per element, oriented rows padded to whole blocks
        fields["data"] = (*lead, h, r, codec.padded(c)), torch.uint8
    else:  # two E2M1 codes (NVFP4, MXFP4) or one E4M3 code (MXFP8) per byte; one E4M3 or E8M0 scale per block
        fields["data"] = (*lead, h, r, codec.padded(c) // (1 if codec.kind == Kind.MXFP8 else 2)), torch.uint8
        fields["scales"] = (*lead, h, r, codec.padded(c) // codec.block), torch.uint8
    tile = (codec.rows or r, codec.cols or c) if group == Group.TILE else (1, 1)  # a scale tile's rows, columns
    if group == Group.TILE:
        fields["scales"] = (*lead, h, -(-r // tile[0]), -(-c // tile[1])), torch.float32
    elif group != Group.NONE:
        scale = "row" if group == Group.ROWCOL else group.scale
        fields["global_scale"] = tuple(layout.group_shape(shape, scale, codec.axis)), torch.float32
    if group == Group.ROWCOL:
        fields["col_scale"] = (*lead, h, c), torch.float32
    data, scales, gs, cs = (_field(name, spec, None if out is None else getattr(out, name), x.device)
                            for name, spec in fields.items())
    if decoded is not None:
        decoded = _field("decoded", (shape, torch.float32), decoded, x.device)
    amax = col = None  # row scales are reduced in the kernel, head scales by `head_amax`, the others by torch
    if group == Group.HEAD:
        amax = head_amax(x4, take, skip_nan=codec.order == Order.MUL)  # [B * H]
    elif group == Group.TENSOR:
        amax = _group_amax(x4, codec).reshape(-1)  # [B]
    elif group == Group.TILE:
        amax = _tile_amax(layout.orient(x4, codec.axis), codec, *tile)  # [B * H * Rt * Ct]
    elif group == Group.ROWCOL:
        col = column_factors(layout.orient(x4, codec.axis)).reshape(-1)  # [B * H * C]
    keys, checkpoint = _philox_keys(fmt, keys, checkpoint, n_seq, x.device)
    if x4.numel():
        block_c = max(triton.next_power_of_2(c), codec.block)
        block_r = max(1, min(64, 2048 // block_c))
        seqs = n_seq if take is None else min(n_seq, TAKE_SLOTS)  # grid axis 0: states, or slots for the taken ones
        _encode_kernel[(seqs, triton.cdiv(h * r, block_r))](
            x4, data.view(torch.int16) if codec.kind == Kind.BF16 else data, *(x4 if t is None else t for t in (
                scales, gs, cs, amax, col, keys, checkpoint, None if take is None else take.to(torch.int8), decoded)),
            n_seq, h * r, c, r, {Group.HEAD: r, Group.TENSOR: h * r, Group.TILE: r}.get(group, 1), *tile, *codec.args,
            RANDOM=codec.random, AXIS=codec.basis[0], ROT=codec.rot, BLOCK_R=block_r, BLOCK_C=block_c,
            TAKE=take is not None, BLOCK_B=1 if take is None else triton.next_power_of_2(n_seq),
            DECODED=decoded is not None,
        )
    return PackedState(fmt.name, shape, data, scales, gs, cs)


def _philox_keys(fmt, keys, checkpoint, n_seq: int, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(keys, checkpoint) as the kernels read them, [B] int64 on the state's device; None for deterministic formats."""
    if not fmt.is_stochastic:
        return None, None
    if keys is None or checkpoint is None:
        raise ValueError(f"stochastic format '{fmt.name}' needs keys= and checkpoint= ([B] int64); got None")
    keys = keys.to(device=device, dtype=torch.int64).reshape(-1).contiguous()
    checkpoint = checkpoint.to(device=device, dtype=torch.int64).reshape(-1).contiguous()
    if keys.numel() != n_seq or checkpoint.numel() != n_seq:
        raise ValueError(f"keys and checkpoint need {n_seq} entries (one per state); "
                         f"got {keys.numel()} and {checkpoint.numel()}")
    return keys, checkpoint


def _encode_dual_axis(x4, fmt, codec, shape, take, out, decoded) -> PackedState:
    """`encode_triton` of x4 [B, H, P, N] (the state of `shape`, rotated for `rot=`) in a dual-axis format: one program
    per head. A rotated format's decoded copy is rotated back by torch (the head's FP64 rotation inside the 16-warp
    program did not finish compiling for sm_90 in four minutes) and put into the taken states."""
    *lead, h, rows, cols = layout.oriented_shape(shape, codec.axis)
    fields = {"data": ((*lead, h, packed_bytes(rows, cols, codec)), torch.uint8),
              "global_scale": ((*lead, h, rows), torch.float16), "col_scale": ((*lead, h, cols), torch.float16)}
    data, r, c = (_field(name, spec, None if out is None else getattr(out, name), x4.device)
                  for name, spec in fields.items())
    if decoded is not None:
        decoded = _field("decoded", (shape, torch.float32), decoded, x4.device)
    rotated = None if decoded is None or codec.rot == 1 else torch.empty_like(x4)  # [B, H, P, N] in the rotated basis
    launch_dual_axis_encode(x4, codec, data, r, c, take, decoded if rotated is None else rotated)
    if rotated is not None:
        back = rotate_state(rotated, codec.rot, codec.axis)
        if take is not None:
            back = torch.where(take.view(-1, 1, 1, 1), back, decoded.view(back.shape))
        decoded.copy_(back.reshape(shape))
    return PackedState(fmt.name, shape, data, None, r, c)


def _tile_amax(xo: torch.Tensor, codec: KernelCodec, rows: int, cols: int) -> torch.Tensor:
    """`layout.tile_max` of the oriented xo's magnitudes `[B, H, R, C]` per scale tile of rows x cols, flat
    `[B * H * Rt * Ct]`. Where cols divides C and NaN propagates (ORDER_DIV), each row's block maxima come from a max
    and a min over a view (no |x| or padded copy of the state), and only those are tiled."""
    if codec.order == Order.MUL or xo.shape[-1] % cols:
        return layout.tile_max(layout.magnitudes(xo, codec.order == Order.MUL), rows, cols).reshape(-1)
    blocks = xo.unflatten(-1, (-1, cols))  # [B, H, R, Ct, cols]
    block_max = torch.maximum(blocks.amax(-1), blocks.amin(-1).neg())  # [B, H, R, Ct] max |x|, NaN kept
    return layout.tile_max(block_max, rows, 1).reshape(-1)


def _field(name: str, spec: tuple | None, given: torch.Tensor | None, device) -> torch.Tensor | None:
    """A packed field of (shape, dtype) `spec` (None: the format has none): `given` (an in-place target, checked
    to match and be contiguous) or a new tensor."""
    if spec is None or given is None:
        return None if spec is None else torch.empty(spec[0], dtype=spec[1], device=device)
    if tuple(given.shape) != tuple(spec[0]) or given.dtype != spec[1] or not given.is_contiguous():
        raise ValueError(f"{name} must be a contiguous {spec[1]} {list(spec[0])} to be written in place, got "
                         f"{given.dtype} {list(given.shape)}" + ("" if given.is_contiguous() else " (not contiguous)"))
    return given


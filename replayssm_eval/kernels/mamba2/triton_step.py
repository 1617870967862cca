"""Triton decode kernels of ReplaySSM Mamba-2: the single-token step, verification of drafts, the conventional step.

Layering (mamba_ssm style): `_x_kernel` (Triton) -> `_x` (allocation, grid) -> public function.

- `decode_step_triton` (and the fixed-buffer step, `fixed_step`): one token for every sequence on the
  single-token kernel `_replay_step_kernel` (no tl.dot: row reductions and rank-1 updates in FP32 FMAs), launched
  by `launch_replay_step`. Non-flush sequences read the packed read copy (`read_layout`: NVFP4 codes + E4M3 block
  scales + FP32 global scale, FP8 or integer codes + FP32 scales, or FP16/BF16/FP32 data) and the buffer and write
  no state; flush sequences read S_hi and the buffer, and the kernel writes the FP32 fold, which one vectorised pass
  (`write_checkpoint_packed`) rounds to both copies: this pass does the scale reductions of every format. One
  launch where no sequence or every sequence folds; where some fold, a reading launch (FOLD off) for the others and
  a folding launch for them, each skipping the other's rows (`step_variants.step_launches`).
- `verify_triton`: output-only verification of T drafts appended after the committed entries.
- `conventional_step`: the conventional FP32 decode step the benchmarks compare with.
The kernels compute in FP32 (tl.dot with input_precision="ieee", no TF32; FP32 FMAs in the step kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import Group, Kind, packed_codec
from replayssm_eval.formats.device import (
    E2M1_F16_SCALE, FP8, FP8E5M2, FP8SR, GROUP_HEAD, GROUP_ROW, GROUP_TENSOR, NVFP4, decode_elements, e2m1_decode,
    e2m1_f16, e2m1_f16_hi, e2m1_f16_pair, e4m3_decode, e4m3_fast, e5m2_decode, nibble_lanes,
)
from replayssm_eval.kernels.mamba2._common import Inputs, merge_packed, prepare_inputs
from replayssm_eval.kernels.step_variants import (
    other_launch_row, read_hi_flags, row_reads_hi, step_launches, step_variant,
)
from replayssm_eval.replay.buffer_round import BUF_FP32, buffer_kind, round_buffered
from replayssm_eval.replay.schedule import plan_tokens
from replayssm_eval.replay.state import ReplayState, write_checkpoint_packed

_WIDE_READS = (Kind.FP32, Kind.BF16, Kind.FP16, Kind.FP16SR, Kind.FP16SR_SOFT, Kind.INT16, Kind.INT16SR)  # 16/32-bit


@triton.jit
def _load_read_copy(data_ptr, scale_ptr, gs_ptr, b, h, offs_p, offs_n, mask, H, P, N, NB,
                    READ: tl.constexpr, GROUP: tl.constexpr):
    """Decode a [BLOCK_P, BLOCK_N] tile of the packed read copy (layouts of `formats.formats`)."""
    row = (b * H + h).to(tl.int64) * P + offs_p[:, None]  # [BLOCK_P, 1] row in [B, H, P]
    if READ == NVFP4:  # NVFP4, axis=dstate: 2 codes per byte (low nibble first), one E4M3 scale per 16
        byte = tl.load(data_ptr + row * (NB // 2) + offs_n[None, :] // 2, mask=mask, other=0).to(tl.int32)
        code = (byte >> ((offs_n[None, :] % 2) * 4)) & 0xF
        s_b = e4m3_decode(tl.load(scale_ptr + row * (NB // 16) + offs_n[None, :] // 16, mask=mask, other=0))
        v = e2m1_decode(code) * s_b
    elif (READ == FP8) | (READ == FP8SR):
        v = e4m3_decode(tl.load(data_ptr + row * N + offs_n[None, :], mask=mask, other=0))
    elif READ == FP8E5M2:
        v = e5m2_decode(tl.load(data_ptr + row * N + offs_n[None, :], mask=mask, other=0))
    else:
        v = tl.load(data_ptr + row * N + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    if GROUP == GROUP_ROW:
        v = v * tl.load(gs_ptr + row, mask=offs_p[:, None] < P, other=1.0)
    elif GROUP == GROUP_HEAD:
        v = v * tl.load(gs_ptr + b * H + h)
    elif GROUP == GROUP_TENSOR:
        v = v * tl.load(gs_ptr + b)
    return tl.where(mask, v, 0.0)


@triton.jit
def _replay_kernel(
    x_ptr, b_ptr, dt_ptr, q_ptr,  # entries [B, E, H, P], [B, E, G, N], [B, E, H] in logical order; queries C [B, T, G, N]
    count_ptr, read_hi_ptr, fold_ptr,  # [B] int64 entries before the queries, [B] int8, [B] int8
    hi_ptr, data_ptr, scale_ptr, gs_ptr,  # S_hi [B, H, P, N] fp32 and the packed read copy
    A_ptr, y_ptr, out_ptr,  # y [B, T, H, P]; out [B, H, P, N] the fold of all entries (FP32)
    E, T, H, P, N, G, HPG, NB, skip,
    READ: tl.constexpr, GROUP: tl.constexpr, SKIP: tl.constexpr, FOLD: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // HPG
    offs_e = tl.arange(0, BLOCK_E)
    offs_t = tl.arange(0, BLOCK_T)
    offs_p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p, mask_n = offs_p < P, offs_n < N
    mask_s = mask_p[:, None] & mask_n[None, :]
    count = tl.load(count_ptr + b)
    used = count + T  # entries 0..used-1: committed, then the queries' own
    mask_e = offs_e < used
    row = b.to(tl.int64) * E + offs_e
    dt = tl.load(dt_ptr + row * H + h, mask=mask_e, other=0.0)
    A = tl.load(A_ptr + h)
    cs = tl.cumsum(dt * A, axis=0)  # [BLOCK_E] log G_{0..e}
    x = tl.load(x_ptr + (row[:, None] * H + h) * P + offs_p[None, :], mask=mask_e[:, None] & mask_p[None, :], other=0.0)
    k = tl.load(b_ptr + (row[:, None] * G + g) * N + offs_n[None, :], mask=mask_e[:, None] & mask_n[None, :], other=0.0)
    mask_t = offs_t < T
    q_rows = b.to(tl.int64) * T + offs_t
    q = tl.load(q_ptr + (q_rows[:, None] * G + g) * N + offs_n[None, :], mask=mask_t[:, None] & mask_n[None, :], other=0.0)
    pos = count + offs_t  # [BLOCK_T] entry of each query
    cs_q = tl.sum(tl.where(offs_e[None, :] == pos[:, None], cs[None, :], 0.0), axis=1)  # [BLOCK_T]
    # V (W (.) K^T Q), W the causal decay mask
    w = tl.exp(tl.where(offs_e[None, :] <= pos[:, None], cs_q[:, None] - cs[None, :], float("-inf")))
    scores = tl.dot(q, tl.trans(k), input_precision="ieee") * w * dt[None, :]  # [BLOCK_T, BLOCK_E]
    y = tl.dot(scores, x, input_precision="ieee")
    state_off = b.to(tl.int64) * H * P * N + (h * P + offs_p[:, None]).to(tl.int64) * N + offs_n[None, :]
    # each branch loads only the copy it reads: a non-flush step never touches the FP32 S_hi
    if tl.load(read_hi_ptr + b) != 0:
        src = tl.load(hi_ptr + state_off, mask=mask_s, other=0.0)
    else:
        src = _load_read_copy(data_ptr, scale_ptr, gs_ptr, b, h, offs_p, offs_n, mask_s, H, P, N, NB, READ, GROUP)
    g_read = tl.exp(cs_q)
    if SKIP:
        g_read = tl.where(g_read < skip, 0.0, g_read)
    y += g_read[:, None] * tl.dot(q, tl.trans(src), input_precision="ieee")
    tl.store(y_ptr + (q_rows[:, None] * H + h) * P + offs_p[None, :], y, mask=mask_t[:, None] & mask_p[None, :])
    if FOLD:
        if tl.load(fold_ptr + b) != 0:
            cs_last = tl.sum(tl.where(offs_e == BLOCK_E - 1, cs, 0.0), axis=0)  # entries past `used` have dt = 0
            g_all = tl.exp(cs_last)
            if SKIP:
                g_all = tl.where(g_all < skip, 0.0, g_all)
            wf = tl.exp(cs_last - cs) * dt
            hi = tl.load(hi_ptr + state_off, mask=mask_s, other=0.0)
            folded = g_all * hi + tl.dot(tl.trans(x * wf[:, None]), k, input_precision="ieee")
            tl.store(out_ptr + state_off, folded, mask=mask_s)


def read_layout(state: ReplayState, config) -> tuple[int, int, tuple, int]:
    """(KIND, GROUP, (data, scales, global_scale), padded N) of the read copy the kernels decode: its packed encoding
    where the kernels decode it (`packed_codec`), else the decoded FP32 copy `state.lo`."""
    fmt, packed = config.read_format, state.lo_packed
    n = state.hi.shape[-1]
    codec = None if packed is None else packed_codec(fmt)
    if codec is None:
        return int(Kind.FP32), int(Group.NONE), (state.lo.contiguous(), None, None), n
    fields = tuple(None if t is None else t.contiguous() for t in (packed.data, packed.scales, packed.global_scale))
    return int(codec.kind), int(codec.group), fields, codec.padded(n)


def _replay(x, B, dt, C_q, count, read_hi, fold, A, state, config):
    """Launch `_replay_kernel`: entries [B, E, ...] (queries at count..count+T-1), returns (y [B, T, H, P], fold or None)."""
    batch, E, H, P = x.shape
    T, G, N = C_q.shape[1], B.shape[2], B.shape[3]
    read, group, (data, scales, gs), nb = read_layout(state, config)
    y = torch.empty(batch, T, H, P, dtype=torch.float32, device=x.device)
    do_fold = bool(fold.any())
    out = _fold_out(state) if do_fold else y
    block_p = min(32, max(16, triton.next_power_of_2(P)))
    skip = config.skip_read_below
    _replay_kernel[(batch, H, triton.cdiv(P, block_p))](
        x, B, dt, C_q, count, read_hi.to(torch.int8), fold.to(torch.int8), state.hi.contiguous(), data,
        data if scales is None else scales, data if gs is None else gs, A, y, out,
        E, T, H, P, N, G, H // G, nb, float(skip or 0.0),
        READ=read, GROUP=group, SKIP=skip is not None, FOLD=do_fold,
        BLOCK_E=max(16, triton.next_power_of_2(E)), BLOCK_T=max(16, triton.next_power_of_2(T)), BLOCK_P=block_p,
        BLOCK_N=max(16, triton.next_power_of_2(N)),
    )
    return y, (out if do_fold else None)


# ---------------------------------------------------------------------------------------------- single-token non-flush step
#
# The common decode step (T = 1, no fold) is a pure read: y = G_{0..j} (S_src C) + sum_e w_e (B_e . C) x_e, j = count.
# `_replay_step_kernel` computes it without tl.dot: per (sequence, head, head_dim tiles) program, BC[e] = B_e . C and the
# decays w_e = dt_e exp(cs_j - cs_e) once (a few hundred FMAs), then per [BLOCK_P, N] state tile one streamed load and a
# row reduction sum_n S[p, n] C[n] in FP32 FMAs. Minifloat codes are decoded through FP16 bit patterns (integer
# shifts and masks and one cvt per element); NVFP4 codes load as whole int32 words of 8 in a reading launch and as bytes
# split by nibble in a folding one (each the faster there on an H200, BENCHMARKS.md), and the block scale multiplies a
# word's or a 16-element partial sum, not each element.

@triton.jit
def _read_rowdot(hi_ptr, data_ptr, scale_ptr, gs_ptr, c, c_parts, b, h, rows, mask_p, read_hi,
                 H, N: tl.constexpr, NB: tl.constexpr, READ: tl.constexpr, GROUP: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, WORDS: tl.constexpr):
    """sum_n S_src[p, n] C[n] for one [BLOCK_P] tile of rows: S_hi (FP32) if read_hi else the packed read copy.
    c: C [BLOCK_N]; c_parts (NVFP4 only): WORDS: C's 8 `nibble_lanes` (NVFP4 codes as whole int32 words, lane j
    multiplies nibble j of each word), else (C[2j], C[2j + 1]) as [BLOCK_S, 8] (codes as bytes, j the byte)."""
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    if read_hi:
        s = tl.load(hi_ptr + rows[:, None] * N + offs_n[None, :], mask=mask_p[:, None] & mask_n[None, :], other=0.0)
        out = tl.sum(s * c[None, :], axis=1)
    else:
        if READ == NVFP4 and WORDS:  # whole int32 words of 8 codes [BLOCK_P, 2 BLOCK_S], two words a scale block
            offs_w = tl.arange(0, 2 * BLOCK_S)
            m2 = mask_p[:, None] & (offs_w < NB // 8)[None, :]
            words = tl.load(data_ptr.to(tl.pointer_type(tl.int32)) + rows[:, None] * (NB // 8) + offs_w[None, :],
                            mask=m2, other=0)
            part = tl.zeros(words.shape, dtype=tl.float32)
            for j in tl.static_range(4):
                lo, hi = e2m1_f16_pair(words, j)  # codes 8 w + j, 8 w + j + 4, times 2^-14
                part += lo * c_parts[j][None, :] + hi * c_parts[j + 4][None, :]
            sc = e4m3_fast(tl.load(scale_ptr + rows[:, None] * (NB // 16) + offs_w[None, :] // 2, mask=m2, other=0))
            out = tl.sum(tl.where(m2, part * (sc * E2M1_F16_SCALE), 0.0), axis=1)
        elif READ == NVFP4:  # bytes as [BLOCK_P, scale block, 8]: element 2j low nibble, 2j + 1 high nibble
            offs_s = tl.arange(0, BLOCK_S)
            col = offs_s[:, None] * 8 + tl.arange(0, 8)[None, :]  # [BLOCK_S, 8] byte column
            m3 = mask_p[:, None, None] & (col < NB // 2)[None, :, :]
            byte = tl.load(data_ptr + rows[:, None, None] * (NB // 2) + col[None, :, :], mask=m3, other=0).to(tl.int32)
            part = tl.sum(e2m1_f16(byte) * c_parts[0][None, :, :] + e2m1_f16_hi(byte) * c_parts[1][None, :, :],
                          axis=2)  # [BLOCK_P, BLOCK_S], * 2^-14
            m2 = mask_p[:, None] & (offs_s < NB // 16)[None, :]
            sc = e4m3_fast(tl.load(scale_ptr + rows[:, None] * (NB // 16) + offs_s[None, :], mask=m2, other=0))
            out = tl.sum(tl.where(m2, part * (sc * E2M1_F16_SCALE), 0.0), axis=1)
        else:
            m2 = mask_p[:, None] & mask_n[None, :]
            v = decode_elements(tl.load(data_ptr + rows[:, None] * N + offs_n[None, :], mask=m2, other=0), READ)
            out = tl.sum(v * c[None, :], axis=1)  # masked elements load as 0 and C is 0 past N
        if GROUP == GROUP_ROW:
            out = out * tl.load(gs_ptr + rows, mask=mask_p, other=1.0)
        elif GROUP == GROUP_HEAD:
            out = out * tl.load(gs_ptr + b * H + h)
        elif GROUP == GROUP_TENSOR:
            out = out * tl.load(gs_ptr + b)
    return out


@triton.jit
def _replay_step_kernel(
    x_ptr, b_ptr, dt_ptr, c_ptr,  # buffer x [B, E, H, P], B [B, E, G, N], dt [B, E, H] (the new token at `count`); C [B, G, N]
    count_ptr, read_hi_ptr, fold_ptr,  # [B] int64 committed entries, [B] int8, [B] int8
    hi_ptr, data_ptr, scale_ptr, gs_ptr,  # S_hi [B, H, P, N] fp32 and the packed read copy
    A_ptr, y_ptr, out_ptr,  # y [B, H, P] (without D x); out [B, H, P, N] the FP32 fold of the folding sequences
    E, H, G, HPG, skip,
    P: tl.constexpr, N: tl.constexpr, NB: tl.constexpr,
    READ: tl.constexpr, GROUP: tl.constexpr, SKIP: tl.constexpr, FOLD: tl.constexpr, SPLIT: tl.constexpr,
    HI_AT_FOLD: tl.constexpr, BUF: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, TILES: tl.constexpr,
):
    b = tl.program_id(0)
    if other_launch_row(fold_ptr, b, FOLD, SPLIT):  # some rows fold: the other launch takes this row
        return
    h = tl.program_id(1)
    g = h // HPG
    count = tl.load(count_ptr + b)
    offs_e = tl.arange(0, BLOCK_E)
    mask_e = (offs_e <= count) & (offs_e < E)
    row_e = b.to(tl.int64) * E + offs_e
    dt = tl.load(dt_ptr + row_e * H + h, mask=mask_e, other=0.0)
    cs = tl.cumsum(dt * tl.load(A_ptr + h), axis=0)  # [BLOCK_E] log G_{0..e}
    cs_q = tl.sum(tl.where(offs_e == count, cs, 0.0), axis=0)  # log G_{0..j} of the query entry j = count
    w = tl.exp(cs_q - cs) * dt  # dt_e G_{e+1..j}; 0 past j (dt = 0)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    gn = (b.to(tl.int64) * G + g) * N
    c = tl.load(c_ptr + gn + offs_n, mask=mask_n, other=0.0)
    k = tl.load(b_ptr + (row_e[:, None] * G + g) * N + offs_n[None, :], mask=mask_e[:, None] & mask_n[None, :], other=0.0)
    coef = tl.sum(k * c[None, :], axis=1) * w  # [BLOCK_E] w_e (B_e . C)
    if READ == NVFP4 and not FOLD:  # C in 8 strided lanes once per program: lane j multiplies nibble j of each word
        offs_c = tl.arange(0, 16 * BLOCK_S)
        c_parts = nibble_lanes(tl.load(c_ptr + gn + offs_c, mask=offs_c < N, other=0.0), 2 * BLOCK_S)
    elif READ == NVFP4:  # C split by parity once per program: the two nibbles of byte j multiply C[2j] and C[2j + 1]
        col = tl.arange(0, BLOCK_S)[:, None] * 8 + tl.arange(0, 8)[None, :]
        c_parts = (tl.load(c_ptr + gn + 2 * col, mask=2 * col < N, other=0.0),
                   tl.load(c_ptr + gn + 2 * col + 1, mask=2 * col + 1 < N, other=0.0))
    else:
        c_parts = (c, c)
    g_read = tl.exp(cs_q)
    if SKIP:
        g_read = tl.where(g_read < skip, 0.0, g_read)
        do_read = g_read != 0.0  # the checkpoint term is zeroed: skip its read
    else:
        do_read = True
    read_hi = row_reads_hi(read_hi_ptr, b, FOLD, HI_AT_FOLD)
    bh = b.to(tl.int64) * H + h
    for i in tl.static_range(TILES):
        offs_p = (tl.program_id(2) * TILES + i) * BLOCK_P + tl.arange(0, BLOCK_P)
        mask_p = offs_p < P
        rows = bh * P + offs_p  # [BLOCK_P] row in [B, H, P]
        xv = tl.load(x_ptr + (row_e[:, None] * H + h) * P + offs_p[None, :], mask=mask_e[:, None] & mask_p[None, :],
                     other=0.0)
        y = tl.sum(xv * coef[:, None], axis=0)  # [BLOCK_P] buffer term
        # a folding launch runs the folding rows alone (`step_launches`): the flush's
        # fold = G_{0..j} S_hi + sum_{e<=j} dt_e G_{e+1..j} x_e B_e^T, rank-1 updates in FP32 FMAs
        if FOLD:
            upd = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
            e = 0
            while e <= count:  # a while loop: the interpreter cannot take range() of a runtime scalar
                w_e = tl.sum(tl.where(offs_e == e, w, 0.0), axis=0)
                r = b.to(tl.int64) * E + e
                x_e = tl.load(x_ptr + (r * H + h) * P + offs_p, mask=mask_p, other=0.0)
                b_e = tl.load(b_ptr + (r * G + g) * N + offs_n, mask=mask_n, other=0.0)
                if BUF == BUF_FP32:
                    upd += (w_e * x_e)[:, None] * b_e[None, :]
                else:  # the scaled key w_e B_e in the buffer dtype, as the chunked fold
                    upd += x_e[:, None] * round_buffered(w_e * b_e, BUF)[None, :]
                e += 1
            m2 = mask_p[:, None] & mask_n[None, :]  # S_hi loaded after the sum: the two tiles are not live together
            s_hi = tl.load(hi_ptr + rows[:, None] * N + offs_n[None, :], mask=m2, other=0.0)
            tl.store(out_ptr + rows[:, None] * N + offs_n[None, :], g_read * s_hi + upd, mask=m2)
            if read_hi:
                y += g_read * tl.sum(s_hi * c[None, :], axis=1)
            else:
                y += g_read * _read_rowdot(hi_ptr, data_ptr, scale_ptr, gs_ptr, c, c_parts, b, h, rows, mask_p,
                                           read_hi, H, N, NB, READ, GROUP, BLOCK_N, BLOCK_S, not FOLD)
        else:
            if do_read:
                y += g_read * _read_rowdot(hi_ptr, data_ptr, scale_ptr, gs_ptr, c, c_parts, b, h, rows, mask_p,
                                           read_hi, H, N, NB, READ, GROUP, BLOCK_N, BLOCK_S, not FOLD)
        tl.store(y_ptr + rows, y, mask=mask_p)


def step_launch_config(batch: int, heads: int, head_dim: int, read: int, fold: bool = False) -> dict:
    """BLOCK_P, TILES (head_dim tiles per program) and num_warps of `_replay_step_kernel` (tuned by
    benchmarks/kernel_speed.py); fold: of a folding launch."""
    if batch * heads < 4096:
        return {"BLOCK_P": min(16, triton.next_power_of_2(head_dim)), "TILES": 1, "num_warps": 4}
    if fold:  # many folding sequences: single-warp programs of two 8-row tiles (the H100 sweep's best at P = 80,
        # batch 256, for both read copies: 1.05 ms against 1.13 for a head's ten tiles in one program)
        block_p = min(8, triton.next_power_of_2(head_dim))
        return {"BLOCK_P": block_p, "TILES": min(2, triton.cdiv(head_dim, block_p)), "num_warps": 1}
    # many sequences: one single-warp program per head (the H200 sweep's best at P = 80, batch 128 and 256), 8 rows a
    # tile for reads of 16- and 32-bit elements
    block_p = min(8 if read in _WIDE_READS else 16, triton.next_power_of_2(head_dim))
    return {"BLOCK_P": block_p, "TILES": triton.cdiv(head_dim, block_p), "num_warps": 1}


def step_grid(batch: int, heads: int, head_dim: int, block_p: int, tiles: int) -> tuple[int, int, int]:
    return batch, heads, triton.cdiv(triton.cdiv(head_dim, block_p), tiles)


def launch_replay_step(x, B, dt, C, count, read_hi, fold, A, hi, read_copy, y, out, *, folds, skip, buf_kind,
                       launch=None):
    """Launch `_replay_step_kernel`: one query per sequence at entry count[b] of the buffer (the last entry it uses),
    into the given tensors, with no allocation and no host sync (the launch of the eager step, `decode_step_triton`,
    and of the fixed-buffer step, `fixed_step`). folds: the step variant, "none", "some" or "all" rows fold
    (`step_variants.FOLDS`); "some" launches the kernel twice (`step_variants.step_launches`): the reading path for
    the rows that do not fold and the folding path for those that do, each launch's programs of the other's rows
    returning at once, so a row's output never depends on whether other rows fold at this token.

    x [B, E, H, P], B [B, E, G, N], dt [B, E, H]: the buffer with the token at count[b]; C [B, G, N]; count [B] int64;
    read_hi [B] int8, or None where rows read S_hi exactly where they fold (a fixed window,
    `step_variants.read_hi_flags`); fold [B] int8 (fold after the token); A [H]; hi: S_hi [B, H, P, N] FP32 (read
    where read_hi[b] or fold[b]); read_copy: `read_layout` of the state. Writes y [B, H, P] (without D x) and, unless
    folds is "none", the FP32 fold of entries 0..count[b] of the folding rows into out [B, H, P, N], which may be hi
    itself (a program reads its rows of S_hi before writing them). skip: skip_read_below; buf_kind:
    `buffer_round.buffer_kind` of the config; launch: a launch config instead of `step_launch_config`'s."""
    batch, E, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    read, group, (data, scales, gs), nb = read_copy
    block_nb = max(16, triton.next_power_of_2(nb))
    read_hi, hi_at_fold = read_hi_flags(read_hi, fold)
    for fold_path, split in step_launches(folds):
        cfg = launch or step_launch_config(batch, H, P, read, fold_path)
        _replay_step_kernel[step_grid(batch, H, P, cfg["BLOCK_P"], cfg["TILES"])](
            x, B, dt, C, count, read_hi, fold, hi, data,
            data if scales is None else scales, data if gs is None else gs, A, y, out,
            E, H, G, H // G, float(skip or 0.0),
            P=P, N=N, NB=nb, READ=read, GROUP=group, SKIP=skip is not None, FOLD=fold_path, SPLIT=split,
            HI_AT_FOLD=hi_at_fold, BUF=buf_kind,
            BLOCK_E=max(2, triton.next_power_of_2(E)), BLOCK_N=triton.next_power_of_2(N), BLOCK_S=block_nb // 16,
            **cfg,
        )


def _replay_step(x, B, dt, C, count, read_hi, fold, A, state, config, launch=None):
    """`launch_replay_step` with new outputs: sequences with fold[b] ([B] bool) also get their FP32 fold of entries
    0..count[b]; read_hi: [B] bool, or None where a row reads S_hi exactly where it folds. Returns (y [B, H, P], the
    folds or None where no row folds)."""
    batch, _, H, P = x.shape
    y = torch.empty(batch, H, P, dtype=torch.float32, device=x.device)
    folds = step_variant(fold)
    out = _fold_out(state) if folds != "none" else y
    launch_replay_step(x, B, dt, C, count, None if read_hi is None else read_hi.to(torch.int8), fold.to(torch.int8),
                       A, state.hi.contiguous(), read_layout(state, config), y, out, folds=folds,
                       skip=config.skip_read_below, buf_kind=buffer_kind(config), launch=launch)
    return y, (out if folds != "none" else None)


def _fold_out(state: ReplayState) -> torch.Tensor:
    """The FP32 folds [B, H, P, N] a kernel writes, contiguous as it writes them (not `empty_like` of S_hi, which a
    format decoding along head_dim leaves a transposed view)."""
    return torch.empty(state.hi.shape, dtype=torch.float32, device=state.hi.device)


def _check_fp32(inp: Inputs):
    if inp.x.dtype != torch.float32:
        raise ValueError("compute_dtype must be torch.float32 for the Triton kernels")


def decode_step_triton(x, dt, A, B, C, D, state, config, *, layer_idx=0, seq_ids=None, compute_dtype=torch.float32):
    """One decode token for every sequence: x [B, H, P], dt [B, H], B and C [B, G, N], D [H], state a ReplayState
    (or the FP32 state at the anchor). Returns y [B, H, P] and the ReplayState after the token.

    Non-flush sequences read the packed read copy and the buffer; flush sequences read S_hi and the
    buffer, the kernel writes their FP32 fold and `write_checkpoint_packed` rounds it to both copies (with their
    error-feedback residuals, where the config keeps them).
    """
    inp = prepare_inputs(x[:, None], dt[:, None], A, B[:, None], C[:, None], D, state, config, layer_idx, seq_ids,
                   compute_dtype)
    _check_fp32(inp)
    st, cfg = inp.state, inp.config
    plan, after = plan_tokens(cfg, st.schedule, 1, st.seq_ids)
    rows = torch.arange(x.shape[0], device=x.device)
    buffer = {k: v.clone() for k, v in st.buffer.items()}
    count = st.schedule.count
    for key, new in (("x", inp.x), ("B", inp.B), ("dt", inp.dt)):
        buffer[key][rows, count] = new[:, 0]
    read_hi = plan.read_hi[:, 0] if cfg.speculative is not None else None  # a fixed window reads S_hi at its flush
    y, folded = _replay_step(buffer["x"], buffer["B"], buffer["dt"], inp.C[:, 0].contiguous(), count.contiguous(),
                             read_hi, plan.fold_after[:, 0], inp.A.contiguous(), st, cfg)
    y = y + inp.D[:, None] * inp.x_skip[:, 0]
    hi, lo, packed, checkpoint = st.hi, st.lo, st.lo_packed, st.checkpoint
    fold = plan.fold_after[:, 0].nonzero().flatten()
    if len(fold):
        checkpoint = checkpoint.clone()
        checkpoint[fold] += 1
        residual = {copy: t[fold] for copy, t in st.residual.items()}  # the folding rows' error-feedback residuals
        new_hi, new_lo, new_packed = write_checkpoint_packed(folded[fold], cfg, st.layer, st.seq_ids[fold],
                                                             checkpoint[fold], residual)
        for copy, t in residual.items():
            st.residual[copy][fold] = t  # the call's own copies (`prepare_inputs`)
        hi, lo = hi.clone(), lo.clone()
        hi[fold], lo[fold] = new_hi, new_lo
        lo = hi if cfg.shared else lo
        packed = merge_packed(packed, new_packed, fold, x.shape[0])
    return y.to(inp.out_dtype), ReplayState(hi, lo, buffer, after, checkpoint, st.seq_ids, st.layer, packed,
                                            st.residual)


def verify_triton(x, dt, A, B, C, D, state, config, *, layer_idx=0, compute_dtype=torch.float32):
    """Output-only verification of T drafts x [B, T, H, P] (dt [B, T, H], B and C [B, T, G, N]) appended after the
    committed entries of `state` (a ReplayState): O = G (S_src C^T) + V (W (.) (K^T Q)) + D x, with S_src = S_hi if
    `state.schedule.step_read_hi` else the packed read copy. Returns O [B, T, H, P]; the state is not changed.
    """
    if not isinstance(state, ReplayState):
        raise ValueError(f"state must be a ReplayState (the committed entries and checkpoint), got {type(state).__name__}")
    inp = prepare_inputs(x, dt, A, B, C, D, state, config, layer_idx, None, compute_dtype)
    _check_fp32(inp)
    st = inp.state
    batch, drafts = x.shape[:2]
    count = st.schedule.count
    E = int(count.max()) + drafts
    ring = {}
    for key, new in (("x", inp.x), ("B", inp.B), ("dt", inp.dt)):
        buf = st.buffer[key]
        ent = torch.zeros(batch, E, *buf.shape[2:], dtype=buf.dtype, device=buf.device)
        ent[:, :min(E, buf.shape[1])] = buf[:, :E]
        index = (count[:, None] + torch.arange(drafts, device=x.device)).view(batch, drafts, *[1] * (new.dim() - 2))
        ring[key] = ent.scatter(1, index.expand_as(new), new)
    y, _ = _replay(ring["x"], ring["B"], ring["dt"], inp.C.contiguous(), count.contiguous(), st.schedule.step_read_hi,
                   torch.zeros(batch, dtype=torch.bool, device=x.device), inp.A.contiguous(), st, inp.config)
    return (y + inp.D[:, None] * inp.x_skip).to(inp.out_dtype)


@triton.jit
def _conventional_step_kernel(
    x_ptr, dt_ptr, A_ptr, b_ptr, c_ptr, D_ptr, s_ptr, y_ptr,  # x, y [B, H, P]; dt [B, H]; B, C [B, G, N]; state [B, H, P, N]
    H, P, N, G, HPG,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p, mask_n = offs_p < P, offs_n < N
    mask = mask_p[:, None] & mask_n[None, :]
    bh = b.to(tl.int64) * H + h
    s_off = (bh * P + offs_p[:, None]) * N + offs_n[None, :]
    s = tl.load(s_ptr + s_off, mask=mask, other=0.0)
    x = tl.load(x_ptr + bh * P + offs_p, mask=mask_p, other=0.0)
    dt = tl.load(dt_ptr + bh)
    a = tl.exp(dt * tl.load(A_ptr + h))
    bg = (b.to(tl.int64) * G + h // HPG) * N + offs_n
    bv = tl.load(b_ptr + bg, mask=mask_n, other=0.0)
    cv = tl.load(c_ptr + bg, mask=mask_n, other=0.0)
    s = a * s + (dt * x)[:, None] * bv[None, :]
    y = tl.sum(s * cv[None, :], axis=1) + tl.load(D_ptr + h) * x
    tl.store(s_ptr + s_off, s, mask=mask)
    tl.store(y_ptr + bh * P + offs_p, y, mask=mask_p)


def conventional_step(x, dt, A, B, C, D, state, *, block_p=16, num_warps=4):
    """Conventional eager decoding of one token with an FP32 state (selective_state_update style), the baseline
    the benchmarks compare ReplaySSM with: read the state, decay it, add dt x B^T, write it back in place.

    x [B, H, P], dt [B, H] (after softplus and bias), A [H], B and C [B, G, N], D [H], state [B, H, P, N]; all FP32
    and contiguous. Returns y = S C + D x [B, H, P]; `state` holds S afterwards (= decode_reference with "fp32").
    """
    batch, heads, head_dim, d_state = state.shape
    groups = B.shape[1]
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("state", state)):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 tensor, got {t.dtype} (contiguous={t.is_contiguous()})")
    y = torch.empty_like(x)
    grid = (batch, heads, triton.cdiv(head_dim, block_p))
    _conventional_step_kernel[grid](x, dt, A, B, C, D, state, y, heads, head_dim, d_state, groups, heads // groups,
                                    BLOCK_P=block_p, BLOCK_N=triton.next_power_of_2(d_state), num_warps=num_warps)
    return y

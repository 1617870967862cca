"""STEPQuant's dual-axis packed layout written in one launch (`encode_triton`'s path for `dualaxis`).

One program per state head: the factors and codes of the whole oriented head (`device.dual_axis_codes`, the
chunked kernels' code), the FP16 row and column factors, optionally the decoded head, and the codes z + q as
`width`-bit fields of the head's row-major [R, C] (`dual_axis.pack_codes`): the program writes its codes to a scratch
row, then builds each byte from the (at most four) codes whose bits it holds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import KernelCodec
from replayssm_eval.formats.device import AXIS_HEADDIM, dual_axis_codes

_FP16_NAN = tl.constexpr(0x7E00)  # the FP16 NaN torch's `.half()` writes: the factors of a head holding Inf or NaN
_BYTES = 512  # packed bytes a program builds at once
_CODES_PER_BYTE = tl.constexpr(4)  # codes whose bits one byte can hold: ceil(8 / width) + 1 for widths >= 3
# a [128, 128] head's FP64 sums in registers: 16 warps compile to 127 registers without spills for sm_90 (8 warps: 228,
# 4: 255 and 296 bytes of spills); not timed on a GPU
_WARPS = 16


@triton.jit
def _dual_axis_encode_kernel(
    x_ptr, data_ptr, r_ptr, c_ptr, decoded_ptr, codes_ptr, take_ptr,  # x, decoded [B, H, P, N]; data [B, H, NBYTES]; r [B, H, R]; c [B, H, C]; codes [B, H, R * C]; take [B]
    H, NBYTES,
    P: tl.constexpr, N: tl.constexpr, QMAX: tl.constexpr, WIDTH: tl.constexpr, AXIS: tl.constexpr,
    TAKE: tl.constexpr, DECODED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BYTES: tl.constexpr,
):
    bh = tl.program_id(0)
    taken = True
    if TAKE:
        taken = tl.load(take_ptr + bh // H) != 0
    if taken:
        offs_p, offs_n = tl.arange(0, BLOCK_P), tl.arange(0, BLOCK_N)
        mask = (offs_p < P)[:, None] & (offs_n < N)[None, :]
        head = bh.to(tl.int64) * P * N
        x = tl.load(x_ptr + head + offs_p[:, None] * N + offs_n[None, :], mask=mask, other=0.0)  # [BLOCK_P, BLOCK_N]
        if AXIS == AXIS_HEADDIM:  # oriented [R, C] = [N, P]: the format's rows are d_state indices
            z, r, c, bad = dual_axis_codes(tl.trans(x), QMAX, P)
            z, s = tl.trans(z), tl.trans((r * c) + tl.zeros_like(z))  # [BLOCK_P, BLOCK_N]
            rows, cols, r_at, c_at = N, P, offs_n, offs_p
            r, c = tl.reshape(r, (BLOCK_N,)), tl.reshape(c, (BLOCK_P,))
            k = offs_n[None, :] * P + offs_p[:, None]  # [BLOCK_P, BLOCK_N] the code's index in the row-major [R, C]
        else:
            z, r, c, bad = dual_axis_codes(x, QMAX, N)
            s = (r * c) + tl.zeros_like(z)
            rows, cols, r_at, c_at = P, N, offs_p, offs_n
            r, c = tl.reshape(r, (BLOCK_P,)), tl.reshape(c, (BLOCK_N,))
            k = offs_p[:, None] * N + offs_n[None, :]
        z = tl.where(bad != 0, 0.0, z)  # a head holding Inf or NaN: NaN factors and z = 0 (codes q), as torch's
        bad = tl.reshape(bad, (1,)) != 0
        # the factors as FP16 bits, torch's NaN for such a head
        r_bits = tl.where(bad, _FP16_NAN, r.to(tl.float16).to(tl.int16, bitcast=True))
        c_bits = tl.where(bad, _FP16_NAN, c.to(tl.float16).to(tl.int16, bitcast=True))
        tl.store(r_ptr + bh.to(tl.int64) * rows + r_at, r_bits, mask=r_at < rows)
        tl.store(c_ptr + bh.to(tl.int64) * cols + c_at, c_bits, mask=c_at < cols)
        if DECODED:
            y = tl.where(tl.reshape(bad, (1, 1)), float("nan"), z * s)
            tl.store(decoded_ptr + head + offs_p[:, None] * N + offs_n[None, :], y, mask=mask)
        tl.store(codes_ptr + head + k, (z + QMAX).to(tl.uint8), mask=mask)
        tl.debug_barrier()  # the codes come back through other threads
        m0 = 0
        while m0 < NBYTES:  # a while loop: the interpreter cannot take range() of a runtime scalar
            m = m0 + tl.arange(0, BYTES)  # [BYTES] bytes of the head's bit string, bits [8m, 8m + 8)
            first = (8 * m) // WIDTH  # the code holding bit 8m
            packed = tl.zeros([BYTES], dtype=tl.int32)
            for t in tl.static_range(_CODES_PER_BYTE):
                code = first + t
                shift = code * WIDTH - 8 * m  # where the code's bit 0 lands in the byte: > -WIDTH
                live = (code < P * N) & (shift < 8) & (m < NBYTES)
                u = tl.load(codes_ptr + head + code, mask=live, other=0).to(tl.int32)
                part = tl.where(shift >= 0, u << tl.maximum(shift, 0), u >> tl.maximum(-shift, 0))
                packed |= tl.where(live, part & 0xFF, 0)
            tl.store(data_ptr + bh.to(tl.int64) * NBYTES + m, packed.to(tl.uint8), mask=m < NBYTES)
            m0 += BYTES


def code_width(codec: KernelCodec) -> int:
    """The code width of a dual-axis codec, from its q = 2^(width - 1) - 1."""
    return int(codec.max + 1).bit_length()


def packed_bytes(rows: int, cols: int, codec: KernelCodec) -> int:
    """Bytes of one head's codes, [R, C] at the codec's width."""
    return -(-rows * cols * code_width(codec) // 8)


def launch_dual_axis_encode(x4: torch.Tensor, codec: KernelCodec, data: torch.Tensor, r: torch.Tensor,
                            c: torch.Tensor, take: torch.Tensor | None, decoded: torch.Tensor | None) -> None:
    """Write the dual-axis encoding of x4 [B, H, P, N] (contiguous FP32; a rotated format's state already rotated)
    into data [B, H, bytes] uint8, r [B, H, R] and c [B, H, C] FP16 (`encode_triton`'s fields, checked there), and its
    decoding (in x4's basis) into decoded; take: [B] bool, only those states."""
    n_seq, h, p, n = x4.shape
    if not x4.numel():
        return
    nbytes = data.shape[-1]
    codes = torch.empty(n_seq * h * p * n, dtype=torch.uint8, device=x4.device)
    _dual_axis_encode_kernel[(n_seq * h,)](
        x4, data, r.view(torch.int16), c.view(torch.int16), x4 if decoded is None else decoded, codes,
        x4 if take is None else take.to(torch.int8), h, nbytes, P=p, N=n, QMAX=codec.max, WIDTH=code_width(codec),
        AXIS=codec.basis[0], TAKE=take is not None, DECODED=decoded is not None,
        BLOCK_P=max(16, triton.next_power_of_2(p)), BLOCK_N=max(16, triton.next_power_of_2(n)),
        BYTES=min(_BYTES, max(16, triton.next_power_of_2(nbytes))), num_warps=_WARPS,
    )

"""Elementwise roundings of FP32 values onto low-precision grids, and the byte codes of FP8 / FP4.

All functions take and return FP32 tensors (the rounded value, still FP32) unless they say codes.

Round to nearest even (RNE):
    bf16, fp16           torch casts; overflow gives +-Inf (IEEE), NaN stays NaN.
    e4m3 (OCP E4M3fn)    clamp to +-448, then RNE (torch cast); "satfinite": +-Inf -> +-448.
    e5m2 (OCP E5M2)      clamp to +-57344, then RNE; "satfinite" like e4m3.
    e2m1 (OCP FP4)       clamp to +-6, then RNE on {0, .5, 1, 1.5, 2, 3, 4, 6}; ties go to the even code.
NaN inputs give NaN (payload unspecified); signs of zero are kept.

Stochastic rounding with K random bits r (0 <= r < 2^K) onto a grid with M mantissa bits and
smallest normal exponent EMIN: with e = floor(log2|x|) and quantum q = 2^(max(e, EMIN) - M),

    SR(x) = sign(x) * q * floor(|x| / q + r / 2^K)

i.e. r is added directly under the last kept bit and the rest is truncated (the rule of PTX
`cvt.rs`; FlashInfer's software port of `cvt.rs.satfinite.e4m3x4.f32` computes exactly this).
Only the K bits directly below the kept LSB see noise, so P(round up) = floor(2^K * frac) / 2^K:
unbiased whenever x has no more than K bits below the kept LSB, otherwise biased toward zero by
less than q / 2^K.
    fp16 SR   K=13, M=10, EMIN=-14. Results beyond 65504 become +-Inf (no satfinite in
              `cvt.rs.f16x2.f32`); fp16 subnormal results (|x| < 2^-14) keep gradual underflow
              with q = 2^-24. The PTX ISA fixes the random-bit fields of `cvt.rs.f16x2.f32` (bits
              [12:0] for operand b, the low half; [28:16] for operand a, the high half) but not its
              subnormal handling: this gradual underflow is our model of the instruction.
    fp16 SR, software port (`sr_fp16_soft`, FlashInfer's `cvt_rs_f16_sw` on GPUs without cvt.rs):
              r is added to the FP32 bit pattern of |x| under its own 13th mantissa bit and the
              low 13 bits cleared; a result below 2^-14 flushes to +-0, above 65504 becomes +-Inf,
              +-Inf becomes NaN unless r = 0 (the carry lands in the mantissa), NaN stays NaN (one
              whose mantissa carries past bit 31 of the uint32 reads exponent 0 and flushes to +-0).
    e4m3 SR   K=16, M=3, EMIN=-6, then saturate to +-448; +-Inf -> +-448.
    Both: NaN -> NaN; FP32 subnormal inputs -> +-0.
The random words are uint32 values held in int64 tensors; fp16 SR uses bits [12:0] and e4m3 SR
bits [15:0] of each word by default; `k` < the default uses bits [k-1:0] (biased, see above).

Integers (symmetric, saturating to +-qmax; codes are integer-valued FP32):
    round_int(v, qmax)            RNE (ties to even), NaN -> 0
    sr_int(v, bits, qmax, k)      sign(v) * floor(|v| + r / 2^k), r = bits [k-1:0], computed exactly in
                                  FP64 (|v| <= 2^15 and k <= 32 fit its 53 bits); NaN -> 0.
Two's-complement codes have one zero: -0.0 encodes as code 0 and decodes as +0.0.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E2M1_MAX = 6.0
FP16_MAX = 65504.0
FP16_OVERFLOW = 65520.0  # the smallest |x| that RNE to FP16 turns into Inf
FP16_SR_BITS = 13
E4M3_SR_BITS = 16
F32_SIXTH = 0.1666666716337204  # fp32(1/6), exact in FP32
FLT_MAX = 3.4028234663852886e38  # the largest finite FP32
NVFP4_AMAX = E4M3_MAX * E2M1_MAX  # 2688: NVFP4's S_enc = 2688 / amax maps a group's amax to the largest scaled code
NVFP4_BLOCK = 16  # elements per NVFP4 block scale
MX_BLOCK = 32  # elements per MX block scale
INT8_MAX = 127  # qmax of the symmetric integer codes
INT16_MAX = 32767
INT_SR_BITS = 16  # default random bits of integer SR
MX8_SR_BITS = 8  # default random bits of Pimba's MX8 SR (`microexponent`)

# value of E2M1 code c (bit 3 = sign, bits 2:0 = magnitude index)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def round_fp16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).float()


def _clamp_keep_nan(x: torch.Tensor, bound: float) -> torch.Tensor:
    return torch.clamp(x, -bound, bound)  # torch.clamp propagates NaN


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    return _clamp_keep_nan(x, E4M3_MAX).to(torch.float8_e4m3fn).float()


def round_e5m2(x: torch.Tensor) -> torch.Tensor:
    return _clamp_keep_nan(x, E5M2_MAX).to(torch.float8_e5m2).float()


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    a = _clamp_keep_nan(x, E2M1_MAX).abs()
    # grid spacing: 0.5 below 2, 1 in [2, 4), 2 in [4, 6]; torch.round breaks ties to even
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    return torch.copysign(torch.round(a / step) * step, x)


def _stochastic(x: torch.Tensor, bits: torch.Tensor, k: int, m: int, emin: int) -> torch.Tensor:
    """sign(x) * q * floor(|x| / q + r / 2^k) on integers: r (low k bits) added under the kept LSB."""
    x = x.float()
    r = bits.to(torch.int64) & ((1 << k) - 1)
    u = x.view(torch.int32).to(torch.int64) & 0x7FFFFFFF
    e_field = u >> 23
    mant24 = (u & 0x7FFFFF) | (1 << 23)
    e = e_field - 127
    e_eff = torch.clamp(e, min=emin)
    drop = (23 - m + e_eff - e).clamp(max=60)  # bits of mant24 below the kept LSB
    kept = (mant24 + (r << (drop - k))) >> drop  # in units of q (may carry into the next binade)
    q = torch.ldexp(torch.ones_like(x), (e_eff - m).to(torch.int32))
    mag = kept.to(torch.float32) * q
    mag = torch.where(e_field == 0, 0.0, mag)
    return torch.where(torch.isnan(x), x, torch.copysign(mag, x))


def sr_fp16(x: torch.Tensor, bits: torch.Tensor, k: int = FP16_SR_BITS) -> torch.Tensor:
    y = _stochastic(x, bits, k, 10, -14)
    return torch.where(y.abs() > FP16_MAX, torch.copysign(torch.full_like(y, float("inf")), y), y)


def sr_fp16_soft(x: torch.Tensor, bits: torch.Tensor, k: int = FP16_SR_BITS) -> torch.Tensor:
    """fp16 SR as FlashInfer's integer port: r (low k bits, placed under the kept LSB) added to |x|'s bit pattern."""
    x = x.float()
    r = (bits.to(torch.int64) & ((1 << k) - 1)) << (FP16_SR_BITS - k)
    u = ((x.view(torch.int32).to(torch.int64) & 0x7FFFFFFF) + r) & 0xFFFFFFFF  # |x| + noise, uint32 as the port
    e_field = (u >> 23) & 0xFF  # a NaN whose carry wraps past bit 31 reads exponent 0, as in the port
    kept = (u & 0x7FFFE000).to(torch.int32).view(torch.float32)
    inf = torch.full_like(x, float("inf"))
    mag = torch.where(e_field < 113, 0.0, torch.where(e_field > 142, inf, kept))
    mag = torch.where(e_field == 255, torch.where((u & 0x7FFFFF) != 0, torch.nan, inf), mag)
    return torch.copysign(mag, x)


def sr_e4m3(x: torch.Tensor, bits: torch.Tensor, k: int = E4M3_SR_BITS) -> torch.Tensor:
    return _clamp_keep_nan(_stochastic(x, bits, k, 3, -6), E4M3_MAX)


def round_int(v: torch.Tensor, qmax: int) -> torch.Tensor:
    """Integer codes (FP32) of v: RNE, saturating to +-qmax; NaN -> 0."""
    q = torch.clamp(torch.round(v), -qmax, qmax)
    return torch.where(torch.isnan(q), 0.0, q) + 0.0  # + 0.0 turns -0.0 into +0.0


def sr_int(v: torch.Tensor, bits: torch.Tensor, qmax: int, k: int) -> torch.Tensor:
    """Integer codes (FP32) of v: sign(v) * floor(|v| + r / 2^k), saturating to +-qmax; NaN -> 0."""
    r = (bits.to(torch.int64) & ((1 << k) - 1)).double()
    mag = torch.floor(v.double().abs() + r * 2.0 ** -k)  # r * 2^-k is exact in FP64
    q = torch.clamp(torch.copysign(mag, v.double()), -qmax, qmax).float()
    return torch.where(torch.isnan(q), 0.0, q) + 0.0


def e4m3_to_bits(v: torch.Tensor) -> torch.Tensor:
    """uint8 E4M3fn codes of values already on the E4M3 grid (NaN -> 0x7F / 0xFF)."""
    return v.to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_from_bits(codes: torch.Tensor) -> torch.Tensor:
    return codes.to(torch.uint8).view(torch.float8_e4m3fn).float()


def e5m2_to_bits(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float8_e5m2).view(torch.uint8)


def e5m2_from_bits(codes: torch.Tensor) -> torch.Tensor:
    return codes.to(torch.uint8).view(torch.float8_e5m2).float()


def e2m1_to_bits(v: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8 0..15) of values already on the E2M1 grid; NaN -> code 0."""
    a = torch.nan_to_num(v.abs(), nan=0.0)
    mag = torch.where(a < 2, a * 2, torch.where(a < 4, a + 2, a / 2 + 4)).to(torch.uint8)
    sign = torch.signbit(v) & ~torch.isnan(v)
    return mag | (sign.to(torch.uint8) << 3)


def e2m1_from_bits(codes: torch.Tensor) -> torch.Tensor:
    """E2M1_VALUES[code & 0xF], computed on the codes' device (no host table: CUDA-graph capturable)."""
    c = codes.to(torch.int32)
    exp, man = ((c >> 1) & 3).float(), (c & 1).float()
    mag = torch.where(exp == 0, man * 0.5, torch.exp2(exp - 1) * (1 + man * 0.5))
    return torch.where((c & 8) != 0, -mag, mag)


def e8m0_from_bits(codes: torch.Tensor) -> torch.Tensor:
    """2^(code - 127) for E8M0 codes 0..254 (exact, 2^-127 is an FP32 subnormal); code 255 -> NaN."""
    codes = codes.to(torch.int64)
    v = torch.ldexp(torch.ones(codes.shape, dtype=torch.float64, device=codes.device), codes - 127).float()
    return torch.where(codes == 255, torch.nan, v)

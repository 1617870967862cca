"""Triton versions of the state formats: device functions for other kernels, and `quantize_triton`.

Device functions (call them inside your own `@triton.jit` kernels; FP32 in, FP32 out unless noted):
    round_bf16, round_fp16, round_e4m3, round_e5m2, round_e2m1   RNE (fp8/fp4 saturating), as `rounding`
    sr_fp16(x, bits), sr_e4m3(x, bits)                            stochastic, bits = uint32 words
    e4m3_decode(byte), e5m2_decode(byte), e2m1_decode(nibble)      codes -> FP32
    e4m3_encode(v), e5m2_encode(v), e2m1_encode(v)                 on-grid FP32 -> codes (int32)
They use integer and exact FP32 arithmetic only (no hardware cvt, no approximate division), so the
interpreter and any GPU give the same bits as the torch reference.

Fast decoders for kernels that stream a packed copy (one integer shift/or and one exact FP16 -> FP32
cvt per element, same values as the decoders above):
    _e4m3_fast(byte), _e5m2_fast(byte)                             codes -> FP32
    _e2m1_f16(byte), _e2m1_f16_hi(byte)                            low / high nibble -> E2M1 value * 2^-14
                                                                   (multiply by _E2M1_F16_SCALE, once per block)

`encode_triton(x, fmt, keys, checkpoint)` equals `fmt.encode` field by field (the packed checkpoint a
flush writes; Philox keyed per state as `replay.keys`), in one launch after any head/tensor amax.
`quantize_triton(x, fmt, ...)` equals `fmt.quantize(x, ...)` bit for bit. Group amax reductions
(FP8 row/head/tensor scales, NVFP4 global scales) run in torch on the host; block maxima, scales,
rounding and Philox (`tl.randint(seed, offset + flat index)`) run in the kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.quant import layout, philox
from replayssm_eval.quant.formats import FLT_MAX, ElementwiseFormat, FP8Format, MXFormat, NVFP4Format, StateFormat
from replayssm_eval.quant.packed import PackedState

_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: (y + _MAGIC) - _MAGIC rounds 0 <= y < 2^22 to an integer, ties to even


@triton.jit
def _pow2(e):
    """2^e as FP32 for int32 e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _copysign(mag, x):
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    return (mag.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _exponent(a):
    """floor(log2 a) of FP32 a > 0 from its exponent field (-127 for subnormals)."""
    return ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _rne_grid(x, M: tl.constexpr, EMIN: tl.constexpr):
    """RNE of finite or NaN x onto the grid with M mantissa bits and smallest normal exponent EMIN."""
    a = tl.abs(x)
    e = _exponent(a)
    e = tl.where(e < EMIN, EMIN, e)
    y = a * _pow2(M - e)  # exact: |x| in units of the quantum, < 2^(M+1)
    r = (y + _MAGIC) - _MAGIC
    return _copysign(r * _pow2(e - M), x)


@triton.jit
def _clamp(x, bound):
    """clamp to +-bound keeping NaN (comparisons, not min/max, whose NaN rules differ by backend)."""
    x = tl.where(x > bound, bound, x)
    return tl.where(x < -bound, -bound, x)


@triton.jit
def round_bf16(x):
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, r.to(tl.float32, bitcast=True))


@triton.jit
def round_fp16(x):
    q = _rne_grid(tl.where(tl.abs(x) >= 65520.0, 0.0, x), 10, -14)
    return tl.where(tl.abs(x) >= 65520.0, _copysign(tl.full(x.shape, float("inf"), tl.float32), x), q)


@triton.jit
def round_e4m3(x):
    return _rne_grid(_clamp(x, 448.0), 3, -6)


@triton.jit
def round_e5m2(x):
    return _rne_grid(_clamp(x, 57344.0), 2, -14)


@triton.jit
def round_e2m1(x):
    return _rne_grid(_clamp(x, 6.0), 1, 0)


@triton.jit
def _sr_grid(x, bits, K: tl.constexpr, M: tl.constexpr, EMIN: tl.constexpr):
    """sign(x) * q * floor(|x|/q + r/2^K), r = low K bits of `bits`, q = 2^(max(e, EMIN) - M)."""
    u = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    e_field = u >> 23
    mant24 = ((u & 0x7FFFFF) | 0x800000).to(tl.int64)
    e = e_field - 127
    e_eff = tl.where(e < EMIN, EMIN, e)
    drop = 23 - M + e_eff - e
    drop = tl.where(drop > 60, 60, drop).to(tl.int64)
    r = (bits.to(tl.int64) & 0xFFFFFFFF) & ((1 << K) - 1)
    kept = (mant24 + (r << (drop - K))) >> drop
    mag = kept.to(tl.float32) * _pow2(e_eff - M)
    mag = tl.where(e_field == 0, 0.0, mag)
    return tl.where(x != x, x, _copysign(mag, x))


@triton.jit
def sr_fp16(x, bits):
    """FP16 stochastic rounding with bits [12:0] (PTX cvt.rs.f16x2.f32); beyond 65504 -> Inf."""
    y = _sr_grid(x, bits, 13, 10, -14)
    return tl.where(tl.abs(y) > 65504.0, _copysign(tl.full(x.shape, float("inf"), tl.float32), y), y)


@triton.jit
def sr_e4m3(x, bits):
    """E4M3 stochastic rounding with bits [15:0] (PTX cvt.rs.satfinite.e4m3x4.f32), saturating."""
    return _clamp(_sr_grid(x, bits, 16, 3, -6), 448.0)


@triton.jit
def _decode_minifloat(code, E_BITS: tl.constexpr, M: tl.constexpr, BIAS: tl.constexpr):
    c = code.to(tl.int32)
    e = (c >> M) & ((1 << E_BITS) - 1)
    m = (c & ((1 << M) - 1)).to(tl.float32)
    mag = tl.where(e == 0, m * _pow2(e * 0 + (1 - BIAS - M)), (m + (1 << M)) * _pow2(e - BIAS - M))
    sign = ((c >> (E_BITS + M)) & 1).to(tl.uint32) << 31
    return (mag.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_decode(code):
    v = _decode_minifloat(code, 4, 3, 7)
    return tl.where((code.to(tl.int32) & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def e5m2_decode(code):
    v = _decode_minifloat(code, 5, 2, 15)
    e_all = (code.to(tl.int32) & 0x7C) == 0x7C
    inf = tl.where((code.to(tl.int32) & 0x80) != 0, -float("inf"), float("inf"))
    return tl.where(e_all, tl.where((code.to(tl.int32) & 3) == 0, inf, float("nan")), v)


@triton.jit
def e2m1_decode(code):
    return _decode_minifloat(code, 2, 1, 1)


_E2M1_F16_SCALE = tl.constexpr(16384.0)  # 2^14: an E2M1 code placed in FP16 bits (exponent low 2 bits) is its value * 2^-14


@triton.jit
def _e2m1_f16(c):
    """E2M1 value * 2^-14 of the low nibble of c (int32) via the FP16 bit pattern: exact, subnormal codes included."""
    h = ((c & 7) << 9) | ((c & 8) << 12)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e2m1_f16_hi(byte):
    """`_e2m1_f16` of the high nibble of bytes (int32, 0..255), without shifting the nibble down first."""
    h = ((byte & 0x70) << 5) | ((byte & 0x80) << 8)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e4m3_fast(code):
    """E4M3fn bytes -> FP32 through the FP16 bit pattern (= `e4m3_decode`, NaN for 0x7F/0xFF)."""
    c = code.to(tl.int32) & 0xFF
    h = ((c & 0x7F) << 7) | ((c & 0x80) << 8)
    v = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    return tl.where((c & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def _e5m2_fast(code):
    """E5M2 bytes -> FP32: an E5M2 byte is the high byte of the FP16 with the same value (= `e5m2_decode`)."""
    h = (code.to(tl.int32) & 0xFF) << 8
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _minifloat_byte(v, M: tl.constexpr, BIAS: tl.constexpr, MIN_NORMAL: tl.constexpr, SUB_STEPS: tl.constexpr):
    """Byte (int32) of an on-grid FP32 value in a 1-sign, 7-M-exponent, M-mantissa format; NaN -> 0x7F with its sign.
    MIN_NORMAL: the smallest normal value; SUB_STEPS: 1 / the subnormal step."""
    a = tl.abs(v)
    mant = (a.to(tl.int32, bitcast=True) >> (23 - M)) & ((1 << M) - 1)
    mag = tl.where(a < MIN_NORMAL, (a * SUB_STEPS).to(tl.int32), ((_exponent(a) + BIAS) << M) | mant)
    mag = tl.where(v != v, 0x7F, mag)
    return mag | ((v.to(tl.int32, bitcast=True) >> 24) & 0x80)


@triton.jit
def e4m3_encode(v):
    """E4M3fn byte (int32) of an on-grid FP32 value; NaN -> 0x7F with its sign."""
    return _minifloat_byte(v, 3, 7, 0.015625, 512.0)


@triton.jit
def e5m2_encode(v):
    """E5M2 byte (int32) of an on-grid finite FP32 value; NaN -> 0x7F with its sign (as torch's cast)."""
    return _minifloat_byte(v, 2, 15, 0.00006103515625, 65536.0)


@triton.jit
def e2m1_encode(v):
    """E2M1 nibble (int32) of an on-grid FP32 value in [-6, 6]; NaN -> 0."""
    a = tl.where(v != v, 0.0, tl.abs(v))
    idx = tl.where(a < 2.0, a * 2.0, tl.where(a < 4.0, a + 2.0, a * 0.5 + 4.0)).to(tl.int32)
    sign = tl.where(v != v, 0, (v.to(tl.int32, bitcast=True) >> 28) & 8)
    return idx | sign


# format kinds shared by every kernel that rounds a state (globals read inside @triton.jit must be constexpr)
FP32, BF16, FP16, FP16SR, FP8, FP8SR, FP8E5M2, NVFP4, MXFP8, MXFP4 = map(tl.constexpr, range(10))
KINDS = {"fp32": FP32, "bf16": BF16, "fp16": FP16, "fp16sr": FP16SR, "fp8": FP8, "fp8sr": FP8SR,
         "fp8e5m2": FP8E5M2, "nvfp4": NVFP4, "mxfp8": MXFP8, "mxfp4": MXFP4}
_NO_BITS, _BITS_GIVEN, _BITS_PHILOX = map(tl.constexpr, range(3))
_FLT_MAX = tl.constexpr(FLT_MAX)


@triton.jit
def round_kind(v, bits, KIND: tl.constexpr):
    """Element rounding of the unscaled kinds (bits: uint32 words as int64, used by the SR kinds)."""
    if KIND == BF16:
        q = round_bf16(v)
    elif KIND == FP16:
        q = round_fp16(v)
    elif KIND == FP16SR:
        q = sr_fp16(v, bits)
    elif KIND == FP8SR:
        q = sr_e4m3(v, bits)
    elif KIND == FP8E5M2:
        q = round_e5m2(v)
    elif KIND == FP8:
        q = round_e4m3(v)
    else:
        q = v
    return q


@triton.jit
def tile_amax(x, WHOLE: tl.constexpr):
    """[R, 1] amax of each row of x [R, C], or of the whole tile broadcast to every row."""
    amax = tl.max(tl.abs(x), axis=1)[:, None]
    if WHOLE:
        amax = tl.max(amax, axis=0)[None, :] + tl.zeros_like(amax)
    return amax


@triton.jit
def _nvfp4_tile(x, amax, GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """NVFP4 of x [BLOCK_R, BLOCK_C] in TransformerEngine's order of operations (amax [BLOCK_R, 1]).

    Returns q [BLOCK_R, BLOCK_C // 16, 16] E2M1 values, s_b [BLOCK_R, BLOCK_C // 16] E4M3 block
    scales and s_dec [BLOCK_R, 1]; the value is (q * s_b) * s_dec.
    """
    s_enc = tl.math.div_rn(tl.full(amax.shape, 2688.0, tl.float32), amax)
    s_enc = tl.where(s_enc > _FLT_MAX, _FLT_MAX, s_enc)
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    s_dec = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), s_enc)
    xb = tl.reshape(x, (BLOCK_R, BLOCK_C // GROUP, GROUP))
    bmax = tl.max(tl.abs(xb), axis=2)  # [BLOCK_R, BLOCK_C // 16]
    s_b = round_e4m3(bmax * (s_enc * 0.1666666716337204))
    enc_b = tl.math.div_rn(tl.full(s_b.shape, 1.0, tl.float32), s_b * s_dec)
    enc_b = tl.where(enc_b > _FLT_MAX, _FLT_MAX, enc_b)
    v = xb * enc_b[:, :, None]
    q = tl.where(v == 0.0, 0.0, round_e2m1(v))  # a zero (-0.0 included) is code 0
    return q, s_b, s_dec


@triton.jit
def _fp8_scale(amax, FMT_MAX: tl.constexpr):
    """FP8 scale s = amax / FMT_MAX, 1 for an all-zero group (NaN and Inf kept)."""
    s = tl.math.div_rn(amax, tl.full(amax.shape, FMT_MAX, tl.float32))
    return tl.where(s == 0.0, 1.0, s)


@triton.jit
def quantize_tile(x, bits, amax, KIND: tl.constexpr, SCALED: tl.constexpr, FMT_MAX: tl.constexpr,
                  GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """`fmt.quantize` of a tile x [BLOCK_R, BLOCK_C] of format rows, blocks running along C.

    bits: [BLOCK_R, BLOCK_C] uint32 words (SR kinds); amax: [BLOCK_R, 1] amax of each row's
    global-scale group (NVFP4's S_enc, FP8's scale amax / FMT_MAX); SCALED: FP8 with a scale;
    GROUP: the block of NVFP4 (16) or MX (32). Padding must be zero (it never raises a block max).
    """
    if KIND == NVFP4:
        q, s_b, s_dec = _nvfp4_tile(x, amax, GROUP, BLOCK_R, BLOCK_C)
        y = tl.reshape((q * s_b[:, :, None]) * s_dec[:, :, None], (BLOCK_R, BLOCK_C))
    elif (KIND == MXFP8) or (KIND == MXFP4):
        xb = tl.reshape(x, (BLOCK_R, BLOCK_C // GROUP, GROUP))
        ab = tl.abs(xb)
        bmax = tl.max(tl.where(ab != ab, 0.0, ab), axis=2)
        bad = tl.max(((ab != ab) | (ab == float("inf"))).to(tl.int32), axis=2)
        EMAX: tl.constexpr = 2 if KIND == MXFP4 else 8
        code = _exponent(bmax) - EMAX + 127
        code = tl.where(code < 0, 0, tl.where(code > 254, 254, code))
        code = tl.where(bmax == 0.0, 127, code)
        # X = 2^(code - 127) and 1/X, both exact FP32 (2^-127 is subnormal: built from its bits)
        scale = tl.where(code == 0, (1 << 22) + tl.zeros_like(code), (code << 23)).to(tl.float32, bitcast=True)
        inv = tl.where(code == 254, (1 << 22) + tl.zeros_like(code), ((254 - code) << 23)).to(tl.float32, bitcast=True)
        v = xb * inv[:, :, None]
        if KIND == MXFP4:
            q = round_e2m1(v)
        else:
            q = round_e4m3(v)
        q = q * scale[:, :, None]
        y = tl.reshape(tl.where(bad[:, :, None] != 0, float("nan"), q), (BLOCK_R, BLOCK_C))
    elif SCALED:
        s = _fp8_scale(amax, FMT_MAX)
        y = round_kind(tl.math.div_rn(x, s + tl.zeros_like(x)), bits, KIND) * s
    else:
        y = round_kind(x, bits, KIND)
    return y


@triton.jit
def _quantize_kernel(
    x_ptr, y_ptr, amax_ptr, bits_ptr, seed, offset, n_rows, n_cols,
    KIND: tl.constexpr, SCALED: tl.constexpr, FP8_MAX: tl.constexpr, BITS: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # x, y: [n_rows, n_cols] FP32 (oriented rows); amax: [n_rows] group amax of each row's scale group
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    idx = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    x = tl.load(x_ptr + idx, mask=mask, other=0.0)  # [BLOCK_R, BLOCK_C]
    bits = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.int64)
    if BITS == _BITS_GIVEN:
        bits = tl.load(bits_ptr + idx, mask=mask, other=0)
    elif BITS == _BITS_PHILOX:
        bits = tl.randint(seed, offset.to(tl.int64) + idx).to(tl.int64)
    amax = tl.load(amax_ptr + rows, mask=rows < n_rows, other=1.0)[:, None]  # [BLOCK_R, 1]
    y = quantize_tile(x, bits, amax, KIND, SCALED, FP8_MAX, GROUP, BLOCK_R, BLOCK_C)
    tl.store(y_ptr + idx, y, mask=mask)


def _row_amax(xo: torch.Tensor, fmt: StateFormat) -> torch.Tensor | None:
    """Per-row amax of the row's global scale group, `[B*H*R]`, or None when the format has none."""
    scale = getattr(fmt, "scale", "none")
    if isinstance(fmt, MXFormat) or scale == "none":
        return None
    return layout.group_amax(xo, scale).expand(*xo.shape[:3], 1).reshape(-1).contiguous()


def quantize_triton(x: torch.Tensor, fmt: StateFormat, *, seed: int | None = None, offset: int = 0,
                    random_bits: torch.Tensor | None = None) -> torch.Tensor:
    """`fmt.quantize(x, ...)` computed by one Triton kernel; identical bits."""
    if not triton_rounds(fmt):
        raise NotImplementedError(f"quantize_triton does not cover format '{fmt.name}' (see `triton_rounds`)")
    axis = getattr(fmt, "axis", "dstate")
    xo = layout.orient(layout.as_bhpn(x), axis).contiguous()  # [B, H, R, C]
    n_cols = xo.shape[-1]
    n_rows = xo.numel() // max(n_cols, 1)
    mode = _NO_BITS
    bits = xo
    if fmt.is_stochastic:
        if random_bits is not None:
            bits = layout.random_words(x, seed, offset, random_bits).contiguous()
            mode = _BITS_GIVEN
        elif seed is None:
            layout.random_words(x, seed, offset, None)  # raises the missing-seed error
        else:
            mode = _BITS_PHILOX
    amax = _row_amax(xo, fmt)
    group = getattr(fmt, "BLOCK", 1)
    block_c = min(max(triton.next_power_of_2(n_cols), group), 1024)
    block_r = max(1, min(64, 2048 // block_c))
    y = torch.empty_like(xo)
    if xo.numel():
        grid = (triton.cdiv(n_rows, block_r), triton.cdiv(n_cols, block_c))
        _quantize_kernel[grid](
            xo, y, xo if amax is None else amax, bits, int(seed or 0), int(offset), n_rows, n_cols,
            KIND=KINDS[fmt.base].value, SCALED=isinstance(fmt, FP8Format) and fmt.scale != "none",
            FP8_MAX=fmt.max_value if isinstance(fmt, FP8Format) else 1.0, BITS=mode.value,
            GROUP=group, BLOCK_R=block_r, BLOCK_C=block_c,
        )
    return layout.unorient(y, axis).reshape(x.shape).to(x.dtype)


_SCOPE_NONE, _SCOPE_ROW, _SCOPE_GIVEN = map(tl.constexpr, range(3))  # where an encode tile's scale amax comes from


@triton.jit
def _encode_kernel(
    x_ptr, data_ptr, scales_ptr, gs_ptr, amax_ptr, key_ptr, ck_ptr, take_ptr, dec_ptr, n_rows, n_cols, group_rows,
    KIND: tl.constexpr, SCOPE: tl.constexpr, FMT_MAX: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    TAKE: tl.constexpr, DECODED: tl.constexpr,
):
    # x: [B, n_rows, n_cols] FP32 (n_rows = H * P), one program = BLOCK_R whole rows of sequence b;
    # amax: [B * n_rows // group_rows] (SCOPE_GIVEN); key, ck: [B] Philox key and checkpoint (SR kinds);
    # take: [B] int8, TAKE: only sequences with take[b] != 0 are read and written; dec: [B, n_rows, n_cols]
    # FP32, DECODED: the decoded value is stored there too
    b = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    row_ok = rows < n_rows
    if TAKE:
        row_ok = row_ok & (tl.load(take_ptr + b) != 0)
    mask = row_ok[:, None] & (cols[None, :] < n_cols)
    elem = rows[:, None].to(tl.int64) * n_cols + cols[None, :]  # [BLOCK_R, BLOCK_C] index in [H, P, N]
    row_g = b.to(tl.int64) * n_rows + rows  # [BLOCK_R] row of [B * H * P]
    x = tl.load(x_ptr + b.to(tl.int64) * n_rows * n_cols + elem, mask=mask, other=0.0)
    bits = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.int64)
    if (KIND == FP16SR) | (KIND == FP8SR):  # counters of `replay.keys.state_random_bits`
        bits = tl.randint(tl.load(key_ptr + b), (tl.load(ck_ptr + b) << 32) + elem).to(tl.int64)
    group = row_g // group_rows  # [BLOCK_R] global scale group
    amax = tl.zeros((BLOCK_R, 1), dtype=tl.float32)
    if SCOPE == _SCOPE_ROW:  # NaN-propagating like torch's amax (tl.max's NaN rule differs by backend)
        a = tl.abs(x)
        nan = tl.max((a != a).to(tl.int32), axis=1)[:, None]
        amax = tl.where(nan != 0, float("nan"), tl.max(tl.where(a != a, 0.0, a), axis=1)[:, None])
    elif SCOPE == _SCOPE_GIVEN:
        amax = tl.load(amax_ptr + group, mask=row_ok, other=1.0)[:, None]
    first = row_ok & (row_g % group_rows == 0)  # the row that stores its group's global scale
    if KIND == NVFP4:
        q, s_b, s_dec = _nvfp4_tile(x, amax, 16, BLOCK_R, BLOCK_C)
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
            tl.store(dec_ptr + b.to(tl.int64) * n_rows * n_cols + elem, y, mask=mask)
    else:
        v = x
        if SCOPE != _SCOPE_NONE:
            s = _fp8_scale(amax, FMT_MAX)
            v = tl.math.div_rn(x, s + tl.zeros_like(x))
            tl.store(gs_ptr + group[:, None], s, mask=first[:, None])
        q = round_kind(v, bits, KIND)
        if DECODED:  # the decoded element is q, on the format's grid, times the scale
            y = q * s if SCOPE != _SCOPE_NONE else q
            tl.store(dec_ptr + b.to(tl.int64) * n_rows * n_cols + elem, y, mask=mask)
        out = data_ptr + b.to(tl.int64) * n_rows * n_cols + elem
        if (KIND == FP8) | (KIND == FP8SR):
            tl.store(out, e4m3_encode(q).to(tl.uint8), mask=mask)
        elif KIND == FP8E5M2:
            tl.store(out, e5m2_encode(q).to(tl.uint8), mask=mask)
        elif KIND == BF16:  # the high half of the rounded FP32 (data viewed as int16)
            tl.store(out, (q.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)
        elif (KIND == FP16) | (KIND == FP16SR):
            tl.store(out, q.to(tl.float16), mask=mask)  # exact: q is on the FP16 grid
        else:
            tl.store(out, q, mask=mask)


def triton_rounds(fmt: StateFormat) -> bool:
    """Whether the Triton device functions here round `fmt` (the capability every kernel checks first).

    Covered: fp32, bf16, fp16, fp16sr; fp8, fp8sr, fp8e5m2 with axis=dstate and scale row, head, tensor
    or none (any max=); nvfp4 with scale head, tensor or row; mxfp8, mxfp4; stochastic ones only with the
    default Philox rounds and random bits. Not covered (torch rounds them): the integer formats, block
    and rowcol scales, rot=, non-default rounds=/bits=.
    """
    if not isinstance(fmt, (ElementwiseFormat, FP8Format, NVFP4Format, MXFormat)):
        return False
    if fmt.is_stochastic and (fmt.rounds != str(philox.N_ROUNDS) or fmt.bits != fmt.options_for(fmt.base)["bits"][0]):
        return False
    if isinstance(fmt, FP8Format):
        return fmt.axis == "dstate" and fmt.scale in ("row", "head", "tensor", "none")
    if isinstance(fmt, NVFP4Format):
        return fmt.scale != "rowcol"
    return isinstance(fmt, (ElementwiseFormat, MXFormat))


def encode_triton_supports(fmt: StateFormat) -> bool:
    """Whether `encode_triton` covers `fmt` (`triton_rounds`, less MX and NVFP4 with head_dim blocks)."""
    return triton_rounds(fmt) and not isinstance(fmt, MXFormat) and getattr(fmt, "axis", "dstate") == "dstate"


def encode_triton(x: torch.Tensor, fmt: StateFormat, keys: torch.Tensor | None = None,
                  checkpoint: torch.Tensor | None = None, *, take: torch.Tensor | None = None,
                  out: PackedState | None = None, decoded: torch.Tensor | None = None) -> PackedState:
    """`fmt.encode` of a state x `[..., H, P, N]` in one kernel launch; every field bit-identical.

    For stochastic formats keys and checkpoint ([B] int64, B = number of leading indices) give each
    state's Philox key and checkpoint index, and the result equals
    `fmt.encode(x, random_bits=replay.keys.state_random_bits(keys, checkpoint, (H, P, N)))`;
    deterministic formats ignore them and equal `fmt.encode(x)`. Head- and tensor-wide scales take
    one torch amax reduction first; row scales are reduced in the kernel.

    In place, for a flush that rounds some sequences only: out: a PackedState of this format and
    shape whose contiguous fields are written instead of new ones; decoded: a contiguous FP32 tensor
    of x's shape that receives `fmt.decode` of the result; take: [B] bool, only those states are read
    and written (not with scale=tensor, whose one scale spans every state).
    """
    if not encode_triton_supports(fmt):
        raise NotImplementedError(f"encode_triton does not cover format '{fmt.name}'; covered: fp32, bf16, fp16, "
                                  "fp16sr, fp8, fp8sr, fp8e5m2 (scale row, head, tensor or none), nvfp4 with "
                                  "axis=dstate (scale head, tensor or row), default rounds= and bits=")
    x4 = layout.as_bhpn(x).contiguous()  # [B, H, P, N]
    n_seq, h, p, n = x4.shape
    shape = tuple(x.shape)
    lead = layout.shape3(shape)[:-3]
    scale = getattr(fmt, "scale", "none")
    if take is not None and scale == "tensor":
        raise ValueError(f"take= rounds some states only; format '{fmt.name}' scales over all of them")
    fields = {"data": None, "scales": None, "global_scale": None}  # name: (shape, dtype) of each packed field
    if isinstance(fmt, ElementwiseFormat):
        fields["data"] = shape, ElementwiseFormat._DTYPES[fmt.base]
    elif isinstance(fmt, FP8Format):
        fields["data"] = shape, torch.uint8
    else:
        n_blocks = -(-n // fmt.BLOCK)
        fields["data"] = (*lead, h, p, n_blocks * fmt.BLOCK // 2), torch.uint8
        fields["scales"] = (*lead, h, p, n_blocks), torch.uint8
    if scale != "none":
        fields["global_scale"] = tuple(layout.group_shape(shape, scale)), torch.float32
    data, scales, gs = (_field(name, spec, None if out is None else getattr(out, name), x.device)
                        for name, spec in fields.items())
    if decoded is not None:
        decoded = _field("decoded", (shape, torch.float32), decoded, x.device)
    scope, amax = _SCOPE_NONE, None
    if scale == "row":
        scope = _SCOPE_ROW
    elif scale != "none":
        scope, amax = _SCOPE_GIVEN, layout.group_amax(x4, scale).reshape(-1)  # [B * (H | 1)]
    if not fmt.is_stochastic:
        keys = checkpoint = None
    elif keys is None or checkpoint is None:
        raise ValueError(f"stochastic format '{fmt.name}' needs keys= and checkpoint= ([B] int64); got None")
    else:
        keys = keys.to(device=x.device, dtype=torch.int64).reshape(-1).contiguous()
        checkpoint = checkpoint.to(device=x.device, dtype=torch.int64).reshape(-1).contiguous()
        if keys.numel() != n_seq or checkpoint.numel() != n_seq:
            raise ValueError(f"keys and checkpoint need {n_seq} entries (one per state); "
                             f"got {keys.numel()} and {checkpoint.numel()}")
    if x4.numel():
        block_c = max(triton.next_power_of_2(n), getattr(fmt, "BLOCK", 1))
        block_r = max(1, min(64, 2048 // block_c))
        grid = (n_seq, triton.cdiv(h * p, block_r))
        _encode_kernel[grid](
            x4, data.view(torch.int16) if fmt.base == "bf16" else data, x4 if scales is None else scales,
            x4 if gs is None else gs, x4 if amax is None else amax, x4 if keys is None else keys,
            x4 if checkpoint is None else checkpoint, x4 if take is None else take.to(torch.int8),
            x4 if decoded is None else decoded, h * p, n, {"row": 1, "head": p, "tensor": h * p}.get(scale, 1),
            KIND=KINDS[fmt.base].value, SCOPE=scope.value,
            FMT_MAX=fmt.max_value if isinstance(fmt, FP8Format) else 1.0, BLOCK_R=block_r, BLOCK_C=block_c,
            TAKE=take is not None, DECODED=decoded is not None,
        )
    return PackedState(fmt.name, shape, data, scales, gs)


def _field(name: str, spec: tuple | None, given: torch.Tensor | None, device) -> torch.Tensor | None:
    """A packed field of (shape, dtype) `spec` (None: the format has none): `given` (an in-place target, checked
    to match and be contiguous) or a new tensor."""
    if spec is None or given is None:
        return None if spec is None else torch.empty(spec[0], dtype=spec[1], device=device)
    if tuple(given.shape) != tuple(spec[0]) or given.dtype != spec[1] or not given.is_contiguous():
        raise ValueError(f"{name} must be a contiguous {spec[1]} {list(spec[0])} to be written in place, got "
                         f"{given.dtype} {list(given.shape)}" + ("" if given.is_contiguous() else " (not contiguous)"))
    return given


__all__ = [
    "KINDS", "e2m1_decode", "e2m1_encode", "e4m3_decode", "e4m3_encode", "e5m2_decode", "e5m2_encode",
    "encode_triton", "encode_triton_supports", "quantize_tile", "triton_rounds",
    "quantize_triton", "round_bf16", "round_e2m1", "round_e4m3", "round_e5m2", "round_fp16", "round_kind",
    "sr_e4m3", "sr_fp16", "tile_amax",
]

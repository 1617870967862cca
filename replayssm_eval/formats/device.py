"""Triton device codecs of the state formats: the functions every kernel that rounds, encodes or reads a state calls.

Call them inside your own `@triton.jit` kernels (FP32 in, FP32 out unless noted):
    round_bf16, round_fp16, round_e4m3, round_e5m2, round_e2m1   RNE (fp8/fp4 saturating), as `rounding`
    sr_fp16(x, bits), sr_e4m3(x, bits[, K])                       stochastic, bits = uint32 words (K random bits)
    sr_fp16_soft(x, bits)                                          FlashInfer's integer port of sr_fp16
    round_int(v, QMAX), sr_int(v, bits, QMAX[, K])                 integer codes as FP32, as `rounding`
    e4m3_decode(byte), e5m2_decode(byte), e2m1_decode(nibble)      codes -> FP32
    e4m3_encode(v), e5m2_encode(v), e2m1_encode(v)                 on-grid FP32 -> codes (int32)
    quantize_tile, round_tile, round_kind, nvfp4_tile              a format's rounding of a tile, by `KernelCodec`
    round_state_tile                                               round_tile of a [head_dim, d_state] tile, oriented
    mx8_tile(x, fields, SR, BLOCK_R, BLOCK_C)                      Pimba's MX8 (`MicroexponentFormat`) of a tile
    mx8_codes, mx8_values, mx8_bytes                               its codes, their values, its packed bytes
    mx_elements(x, KIND, BLOCK_R, BLOCK_C)                         MXFP8 / MXFP4 elements, block scales and bytes
    hadamard_tile(x, ROT, BLOCK_R, BLOCK_C)                        `rot=hadamard:ROT` on runs along the tile's columns
    scale_elements, group_scale, magnitudes, tile_amax, row_amax,  a scaled kind's group amax and scale
    scale_tile_amax, column_factors                                (column_factors: scale=rowcol's c_j)
    dual_axis_tile, dual_axis_codes (x, QMAX, COLS)                STEPQuant's dual-axis codes of a whole head
    dual_axis_row_sums, dual_axis_fit, dual_axis_value             the same from the head's row sums (a column slab)
    abs_sums(x, AXIS), fp16_factor(s)                              a slab's FP64 row sums (an MMA); a stored factor
    feedback_target(x, e, EF)                                      what an `ef=` copy rounds: x + e
    feedback_residual(target, stored, EF)                          the residual an `ef=` copy keeps
    sub_rn(a, b)                                                   a - b never contracted into an FMA
    state_bits(key, counter, col, KIND, RANDOM)                    the random fields of a stored copy
    seeded_bits(seed, counter, col, KIND, RANDOM)                  the random fields of `quantize(x, seed=...)`
    layout_bits(key, counter, col, KIND, RANDOM, N_ROUNDS)         both: Philox words in a format's word layout
    philox4x32(seed, counter, N_ROUNDS), philox_word(...)          tl.randint4x / tl.randint, bit for bit
    sr_field(word, KIND, BITS)                                     an element's random field from its word
    pair_odd(col, WORDS)                                           1 where an element reads its pair's word, else 0
They use integer and exact FP32 arithmetic only (no approximate division; compiled, `round_int` is one `cvt.rni`), so
the interpreter and any GPU give the same bits as the torch reference; `hadamard_tile` adds in FP64 and multiplies by
powers of two and fp64(1 / sqrt(2)) in `rotation.hadamard_runs`' order, the same bits too
(benchmarks/gpu_check_rotation.py). Constants come from `rounding`.

Fast decoders for kernels that stream a packed copy (integer shifts and masks and one exact FP16 -> FP32
cvt per element, same values as the decoders above):
    e4m3_fast(byte), e5m2_fast(byte), decode_elements(raw, KIND)   codes -> FP32
    e2m1_f16(byte), e2m1_f16_hi(byte)                              low / high nibble -> E2M1 value * 2^-14
                                                                   (multiply by E2M1_F16_SCALE, once per block)
    e2m1_f16_pair(word, J)                                         nibbles J, J + 4 of an int32 word of 8 NVFP4
                                                                   codes -> E2M1 values * 2^-14 (multiply by
                                                                   E2M1_F16_SCALE, once per block)
    nibble_lanes(x, BW)                                            x [8 BW] -> its 8 strided lanes (a tuple): lane J
                                                                   multiplies nibble J of each of BW words

A kernel takes a format as the constexprs of its `KernelCodec` (`codec.args`): KIND (the `Kind`
numbering, constexprs FP32 ... MX8SR here), GROUP (`Group`: GROUP_NONE, GROUP_ROW, GROUP_HEAD,
GROUP_TENSOR, GROUP_TILE, GROUP_ROWCOL, GROUP_DUAL), MAX and ORDER (`Order`: ORDER_DIV, ORDER_MUL); `round_tile`
also ROWS, COLS (`codec.tile`) and ROT (`codec.basis`, whose AXIS, AXIS_DSTATE or AXIS_HEADDIM, tells a kernel how to
orient its tile); a stochastic kind's random words also RANDOM, one tuple constexpr (`codec.random`: WORDS, `Words`:
WORDS_ELEMENT ... WORDS_OCTET; ROUNDS, the Philox rounds of `seeded_bits`; BITS, the format's `bits=`).

Random fields: the roundings of `round_kind` and `mx8_tile` read each element's random bits as a field (uint32) of the
most bits its kind's format accepts (13 FP16 SR, 20 E4M3 SR, 32 integer and MX8 SR), where `sr_field` places the
K = BITS bits [K-1:0] of its word at the top: r 2^(F-K) / 2^F = r / 2^K, so the rounding adds r / 2^K below the kept
LSB, exactly as `rounding` and `MicroexponentFormat` do with `bits=K`. `state_bits` and `seeded_bits` return fields.
The minifloat and MX8 roundings work in 32-bit integers (64-bit shifts cost several instructions each on a GPU).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from replayssm_eval.formats import dual_axis, microexponent, philox, rounding
from replayssm_eval.formats.codec import Group, Kind, Order, Residual, Words
from replayssm_eval.formats.formats import FP8Format, IntFormat

# the numberings of `codec.Kind`, `Group`, `Order` and `Words` (globals read inside @triton.jit must be constexpr)
(FP32, BF16, FP16, FP16SR, FP8, FP8SR, FP8E5M2, NVFP4, MXFP8, MXFP4, INT8, INT16, INT8SR, INT16SR, FP16SR_SOFT, MX8,
 MX8SR) = (tl.constexpr(int(k)) for k in Kind)
(GROUP_NONE, GROUP_ROW, GROUP_HEAD, GROUP_TENSOR, GROUP_TILE, GROUP_ROWCOL,
 GROUP_DUAL) = (tl.constexpr(int(g)) for g in Group)
ORDER_DIV, ORDER_MUL = (tl.constexpr(int(o)) for o in Order)
RESIDUAL_NONE, RESIDUAL_FP32, RESIDUAL_BF16 = (tl.constexpr(int(r)) for r in Residual)
WORDS_ELEMENT, WORDS_PAIR, WORDS_DUO, WORDS_QUAD, WORDS_OCTET = (tl.constexpr(int(w)) for w in Words)
_INTERPRETED = tl.constexpr(triton.knobs.runtime.interpret)  # TRITON_INTERPRET, as triton.jit reads it
AXIS_DSTATE, AXIS_HEADDIM = tl.constexpr(0), tl.constexpr(1)  # `KernelCodec.basis`'s AXIS

_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: (y + _MAGIC) - _MAGIC rounds 0 <= y < 2^22 to an integer, ties to even
# the constants of `rounding` the device functions read
_CONSTANTS = ("E4M3_MAX", "E5M2_MAX", "E2M1_MAX", "FP16_MAX", "FP16_OVERFLOW", "FP16_SR_BITS", "E4M3_SR_BITS", "NVFP4_AMAX",
              "F32_SIXTH", "FLT_MAX", "NVFP4_BLOCK", "MX_BLOCK", "INT_SR_BITS")
(_E4M3_MAX, _E5M2_MAX, _E2M1_MAX, _FP16_MAX, _FP16_OVERFLOW, _FP16_SR_BITS, _E4M3_SR_BITS, _NVFP4_AMAX, _F32_SIXTH,
 _FLT_MAX, _NVFP4_BLOCK, _MX_BLOCK, _INT_SR_BITS) = (tl.constexpr(getattr(rounding, name)) for name in _CONSTANTS)
_INT8_MAX, _INT16_MAX = tl.constexpr(float(rounding.INT8_MAX)), tl.constexpr(float(rounding.INT16_MAX))
# Philox4x32's round multipliers and key increments (Random123; `formats.philox`)
_PHILOX_ROUND_A, _PHILOX_ROUND_B = tl.constexpr(philox.ROUND_A), tl.constexpr(philox.ROUND_B)
_PHILOX_KEY_A, _PHILOX_KEY_B = tl.constexpr(philox.KEY_A), tl.constexpr(philox.KEY_B)
_INV_SQRT2 = tl.constexpr(1 / math.sqrt(2))  # the FP64 constant 1 / sqrt(2) of `rotation.hadamard_runs`
_MX8_BLOCK, _MX8_MANTISSA, _MX8_QMAX = (tl.constexpr(v) for v in (microexponent.BLOCK, microexponent.MANTISSA_BITS,
                                                                      microexponent.MicroexponentFormat.QMAX))
# the random field of each stochastic kind (FP16 SR: _FP16_SR_BITS): the most `bits=` its format accepts (`sr_field`)
_E4M3_SR_FIELD, _INT_SR_FIELD, _MX8_SR_FIELD = (tl.constexpr(fmt.SR_BITS[base][1]) for fmt, base in (
    (FP8Format, "fp8sr"), (IntFormat, "int8sr"), (microexponent.MicroexponentFormat, "mx8sr")))
_FACTOR_MIN, _FACTOR_MAX = tl.constexpr(dual_axis.SCALE_MIN), tl.constexpr(dual_axis.SCALE_MAX)  # dual-axis factors
_ROT_STAGES = tl.constexpr(16)  # butterfly stages `hadamard_tile` unrolls at most (ROT up to 2^16)


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
    q = _rne_grid(tl.where(tl.abs(x) >= _FP16_OVERFLOW, 0.0, x), 10, -14)
    return tl.where(tl.abs(x) >= _FP16_OVERFLOW, _copysign(tl.full(x.shape, float("inf"), tl.float32), x), q)


@triton.jit
def round_e4m3(x):
    return _rne_grid(_clamp(x, _E4M3_MAX), 3, -6)


@triton.jit
def round_e5m2(x):
    return _rne_grid(_clamp(x, _E5M2_MAX), 2, -14)


@triton.jit
def round_e2m1(x):
    return _rne_grid(_clamp(x, _E2M1_MAX), 1, 0)


@triton.jit
def _sr_grid(x, bits, K: tl.constexpr, M: tl.constexpr, EMIN: tl.constexpr):
    """sign(x) * q * floor(|x|/q + r/2^K), r = low K bits of `bits` (uint32), q = 2^(max(e, EMIN) - M), in 32-bit
    integers: with |x| = mant * 2^(e - 23) and drop = 23 - M + max(e, EMIN) - e >= K (K <= 23 - M), the kept steps
    floor((mant + r 2^(drop - K)) / 2^drop) are ((mant >> (drop - K)) + r) >> K exactly (mant's bits below
    2^(drop - K) never reach the next step)."""
    tl.static_assert(K <= 23 - M, "the random field must lie below the kept mantissa")
    u = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    e_field = u >> 23
    mant24 = (u & 0x7FFFFF) | 0x800000
    e = e_field - 127
    e_eff = tl.where(e < EMIN, EMIN, e)
    up = 23 - M + e_eff - e - K
    up = tl.where(up > 24, 24, up)  # mant24 >> 24 is 0 already
    r = bits.to(tl.uint32) & (2**K - 1)  # 2**K, not 1 << K: K may be a constexpr (no __rlshift__)
    kept = ((mant24 >> up).to(tl.uint32) + r) >> K
    mag = kept.to(tl.float32) * _pow2(e_eff - M)
    mag = tl.where(e_field == 0, 0.0, mag)
    return tl.where(x != x, x, _copysign(mag, x))


@triton.jit
def sr_fp16(x, bits):
    """FP16 stochastic rounding with bits [12:0] (PTX cvt.rs.f16x2.f32); beyond 65504 -> Inf."""
    y = _sr_grid(x, bits, _FP16_SR_BITS, 10, -14)
    return tl.where(tl.abs(y) > _FP16_MAX, _copysign(tl.full(x.shape, float("inf"), tl.float32), y), y)


@triton.jit
def sr_fp16_soft(x, bits):
    """FP16 stochastic rounding as FlashInfer's integer port of cvt.rs (`rounding.sr_fp16_soft`): bits [12:0] added to
    |x|'s FP32 bit pattern and its low 13 bits cleared; below 2^-14 -> +-0, beyond 65504 -> +-Inf, +-Inf -> NaN unless
    the bits are 0, a NaN carried past bit 31 -> +-0."""
    u = (x.to(tl.uint32, bitcast=True) & 0x7FFFFFFF) + (bits.to(tl.uint32) & (2**_FP16_SR_BITS - 1))  # < 2^32
    e_field = (u >> 23) & 0xFF
    kept = (u & 0x7FFFE000).to(tl.float32, bitcast=True)
    mag = tl.where(e_field < 113, 0.0, tl.where(e_field > 142, float("inf"), kept))
    mag = tl.where(e_field == 255, tl.where((u & 0x7FFFFF) != 0, float("nan"), float("inf")), mag)
    return _copysign(mag, x)


@triton.jit
def sr_e4m3(x, bits, K: tl.constexpr = _E4M3_SR_BITS):
    """E4M3 stochastic rounding with bits [K-1:0] (K = 16: PTX cvt.rs.satfinite.e4m3x4.f32), saturating."""
    return _clamp(_sr_grid(x, bits, K, 3, -6), _E4M3_MAX)


@triton.jit
def round_int(v, QMAX: tl.constexpr):
    """Integer code (FP32) of v: RNE, saturating to +-QMAX, NaN -> 0, a zero code +0 (`rounding.round_int`).
    Compiled, one `cvt.rni` (sm_90: `FRND`); the interpreter, which runs no PTX, adds and subtracts 1.5 * 2^23."""
    if _INTERPRETED:
        # on |v| as `_rne_grid`: v may be a product, and an add of it could fuse into an FMA that skips its rounding
        r = (tl.abs(_clamp(v, QMAX)) + _MAGIC) - _MAGIC  # |v| <= QMAX < 2^22: rounds to an integer, ties to even
        r = tl.where(r != r, 0.0, r)
        q = tl.where(v < 0, 0.0 - r, r)  # 0.0 - r: a zero code is +0
    else:
        r = tl.inline_asm_elementwise("cvt.rni.f32.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True,
                                      pack=1)  # ties to even; NaN stays NaN
        r = tl.where(tl.abs(r) > 0.0, r, 0.0)  # NaN -> 0, -0 -> +0
        q = tl.minimum(tl.maximum(r, -QMAX), QMAX)  # an integer past QMAX saturates as v would; no NaN left
    return q


@triton.jit
def sr_int(v, bits, QMAX: tl.constexpr, K: tl.constexpr = _INT_SR_BITS):
    """Integer code (FP32) of v: sign(v) * floor(|v| + r / 2^K), r = bits [K-1:0] (K <= 32), saturating to +-QMAX,
    NaN -> 0, a zero code +0 (`rounding.sr_int`), exactly: floor(|v| 2^K) + r in int64, shifted down."""
    a = tl.abs(_clamp(v, QMAX))  # clamping first changes no code: |v| >= QMAX saturates either way
    a = tl.where(a != a, 0.0, a)
    fixed = (a * (2.0**K)).to(tl.int64)  # floor(|v| 2^K), exact: |v| 2^K < 2^(15 + K) is an FP32 value
    mag = (fixed + (bits.to(tl.int64) & (2**K - 1))) >> K
    return tl.where(v < 0, -mag, mag).to(tl.float32)


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


E2M1_F16_SCALE = tl.constexpr(16384.0)  # 2^14: an E2M1 code placed in FP16 bits (exponent low 2 bits) is its value * 2^-14


@triton.jit
def e2m1_f16(c):
    """E2M1 value * 2^-14 of the low nibble of c (int32) via the FP16 bit pattern: exact, subnormal codes included."""
    h = ((c & 7) << 9) | ((c & 8) << 12)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e2m1_f16_hi(byte):
    """`e2m1_f16` of the high nibble of bytes (int32, 0..255), without shifting the nibble down first."""
    h = ((byte & 0x70) << 5) | ((byte & 0x80) << 8)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _shift(x, N: tl.constexpr):
    """x << N for N >= 0, else x >> -N (arithmetic: callers mask the bits the sign fills)."""
    if N >= 0:
        y = x << N
    else:
        y = x >> -N
    return y


@triton.jit
def e2m1_f16_pair(word, J: tl.constexpr):
    """E2M1 values * 2^-14 of nibbles J and J + 4 (J in 0..3) of int32 words of 8 NVFP4 codes, through FP16 bit
    patterns (exact, subnormal codes included). The two nibbles lie 16 bits apart, so one pair of shifts and masks
    places both as FP16 halves: magnitude bits at 9..11 and sign at 15 of each half."""
    h = (_shift(word, 9 - 4 * J) & 0x0E000E00) | (_shift(word, 12 - 4 * J) & -2147450880)  # -2147450880: 0x80008000
    lo = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (h >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def nibble_lanes(x, BW: tl.constexpr):
    """The 8 strided lanes of x [BW * 8] (a tuple): lane j [BW] holds x[8 w + j], the element that multiplies nibble j
    of packed int32 word w (`e2m1_f16_pair`)."""
    a, b = tl.split(tl.reshape(x, (BW, 2, 2, 2)))  # x[8 w + 4 i + 2 j + l]: a holds l = 0, b l = 1
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    l0, l4 = tl.split(tl.reshape(a0, (BW, 2)))
    l2, l6 = tl.split(tl.reshape(a1, (BW, 2)))
    l1, l5 = tl.split(tl.reshape(b0, (BW, 2)))
    l3, l7 = tl.split(tl.reshape(b1, (BW, 2)))
    return l0, l1, l2, l3, l4, l5, l6, l7


@triton.jit
def e4m3_fast(code):
    """E4M3fn bytes -> FP32 through the FP16 bit pattern (= `e4m3_decode`, NaN for 0x7F/0xFF)."""
    c = code.to(tl.int32) & 0xFF
    h = ((c & 0x7F) << 7) | ((c & 0x80) << 8)
    v = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    return tl.where((c & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def e5m2_fast(code):
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


@triton.jit
def round_kind(v, bits, KIND: tl.constexpr):
    """Element rounding of the unscaled kinds (bits: the SR kinds' random fields, `sr_field`); the integer kinds return
    their codes as FP32."""
    if KIND == BF16:
        q = round_bf16(v)
    elif KIND == FP16:
        q = round_fp16(v)
    elif KIND == FP16SR:
        q = sr_fp16(v, bits)
    elif KIND == FP16SR_SOFT:
        q = sr_fp16_soft(v, bits)
    elif KIND == FP8SR:
        q = sr_e4m3(v, bits, _E4M3_SR_FIELD)
    elif KIND == FP8E5M2:
        q = round_e5m2(v)
    elif KIND == FP8:
        q = round_e4m3(v)
    elif KIND == INT8:
        q = round_int(v, _INT8_MAX)
    elif KIND == INT16:
        q = round_int(v, _INT16_MAX)
    elif KIND == INT8SR:
        q = sr_int(v, bits, _INT8_MAX, _INT_SR_FIELD)
    elif KIND == INT16SR:
        q = sr_int(v, bits, _INT16_MAX, _INT_SR_FIELD)
    else:
        q = v
    return q


@triton.jit
def magnitudes(x, ORDER: tl.constexpr):
    """|x| as a group maximum reads it (`layout.magnitudes`): NaN kept (ORDER_DIV) or read as -FLT_MAX (ORDER_MUL)."""
    a = tl.abs(x)
    if ORDER == ORDER_MUL:
        a = tl.where(a != a, -_FLT_MAX, a)
    return a


@triton.jit
def _nan_max(a, AXIS: tl.constexpr):
    """max of the 2-D a along AXIS, kept as a dim of size 1, NaN propagating (comparisons, as tl.max's own NaN rule
    differs by backend; a `tl.reduce` with a NaN-propagating combine would run element by element in the
    interpreter)."""
    nan = tl.max((a != a).to(tl.int32), axis=AXIS, keep_dims=True)
    return tl.where(nan != 0, float("nan"), tl.max(tl.where(a != a, 0.0, a), axis=AXIS, keep_dims=True))


@triton.jit
def tile_amax(x, WHOLE: tl.constexpr, ORDER: tl.constexpr):
    """[R, 1] amax of each row of x [R, C], or of the whole tile broadcast to every row, as torch's
    `layout.group_amax`: NaN propagates (ORDER_DIV) or is skipped (ORDER_MUL)."""
    if ORDER == ORDER_MUL:  # its magnitudes read NaN as -FLT_MAX
        amax = tl.max(magnitudes(x, ORDER), axis=1, keep_dims=True)
    else:
        amax = _nan_max(tl.abs(x), 1)
    if WHOLE:
        amax = _nan_max(amax, 0) + tl.zeros_like(amax)
    return amax


@triton.jit
def scale_tile_amax(x, ROWS: tl.constexpr, COLS: tl.constexpr, ORDER: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_C: tl.constexpr):
    """[BLOCK_R, BLOCK_C] amax of each element's scale tile of ROWS x COLS in x [BLOCK_R, BLOCK_C] (powers of two; 0,
    or more than BLOCK_R / BLOCK_C: the whole extent); NaN propagates (ORDER_DIV; comparisons, as `row_amax`) or is
    skipped (ORDER_MUL)."""
    TR: tl.constexpr = ROWS if (ROWS > 0) and (ROWS < BLOCK_R) else BLOCK_R  # no chained comparisons in compiled code
    TC: tl.constexpr = COLS if (COLS > 0) and (COLS < BLOCK_C) else BLOCK_C
    a = tl.reshape(magnitudes(x, ORDER), (BLOCK_R // TR, TR, BLOCK_C // TC, TC))
    if ORDER == ORDER_MUL:
        amax = tl.max(tl.max(a, axis=3), axis=1)  # [BLOCK_R // TR, BLOCK_C // TC]
    else:
        nan = tl.max(tl.max((a != a).to(tl.int32), axis=3), axis=1)
        amax = tl.where(nan != 0, float("nan"), tl.max(tl.max(tl.where(a != a, 0.0, a), axis=3), axis=1))
    spread = amax[:, None, :, None] + tl.zeros((BLOCK_R // TR, TR, BLOCK_C // TC, TC), tl.float32)
    return tl.reshape(spread, (BLOCK_R, BLOCK_C))


@triton.jit
def row_amax(x, mask, ORDER: tl.constexpr):
    """[R, 1] amax of each row of x [R, C] over mask as torch's `layout.group_amax`: NaN propagates (ORDER_DIV;
    comparisons, as tl.max's own NaN rule differs by backend) or is skipped, the maximum starting at -FLT_MAX
    (ORDER_MUL)."""
    a = magnitudes(x, ORDER)
    if ORDER == ORDER_MUL:
        amax = tl.max(tl.where(mask, a, -_FLT_MAX), axis=1)[:, None]
    else:
        amax = _nan_max(a, 1)
    return amax


@triton.jit
def column_factors(x):
    """[1, C] column factors of scale=rowcol (`formats.column_factors`) of x [R, C] holding the whole oriented head
    (padding zero): max |x| over the rows, NaN propagating, 1 where 0."""
    col = _nan_max(tl.abs(x), 0)
    return tl.where(col == 0.0, 1.0, col)


@triton.jit
def fp16_factor(s):
    """A dual-axis factor as stored (`dual_axis.fp16_scale`): s clamped to [2^-14, 65504], NaN kept, rounded to FP16."""
    s = tl.where(s < _FACTOR_MIN, _FACTOR_MIN, s)
    return round_fp16(tl.where(s > _FACTOR_MAX, _FACTOR_MAX, s))


@triton.jit
def dual_axis_tile(x, QMAX: tl.constexpr, COLS: tl.constexpr):
    """`DualAxisFormat.quantize` of x [R, C], a whole oriented head (padding zero) of COLS columns: the value z (r c)
    of its codes z (`dual_axis_codes`), NaN throughout where the head holds Inf or NaN."""
    return dual_axis_value(x, dual_axis_row_sums(x), QMAX, COLS)


@triton.jit
def dual_axis_value(x, sums, QMAX: tl.constexpr, COLS: tl.constexpr):
    """`dual_axis_tile` of x [R, C], whole rows of the head or a slab of its columns, given sums [R, 1], the FP64
    sums of |x| along each of the head's rows (`dual_axis_row_sums` of the whole head)."""
    z, r, c, bad = dual_axis_fit(x, sums, QMAX, COLS)
    return tl.where(bad != 0, float("nan"), z * ((r * c) + tl.zeros_like(x)))


@triton.jit
def dual_axis_row_sums(x):
    """[R, 1] FP64 sums of |x| along each row of x [R, C]: the sums behind STEPQuant's row factors, NaN where the row
    holds a NaN, Inf where it holds an Inf and no NaN (a sum of FP32 magnitudes never overflows FP64)."""
    return tl.sum(tl.abs(x).to(tl.float64), axis=1, keep_dims=True)


@triton.jit
def abs_sums(x, AXIS: tl.constexpr):
    """FP64 sums of |x| [R, C] along AXIS ([C] for AXIS 0, [R] for 1), NaN where a NaN is summed, else Inf where an
    Inf is: a `tl.dot` of |x| with a ones tile where both dims are at least 16, `tl.sum` elsewhere. On a GPU the dot
    is an FP64 MMA whose operand goes to shared memory in the dot's own layout (the token scan's slab: four 16-byte
    stores a thread), where `tl.sum` across warps stores each thread's FP64 sums 32 ways on one bank. The MMA sums in
    its own order, not `tl.sum`'s."""
    a = tl.abs(x).to(tl.float64)
    if (x.shape[0] < 16) or (x.shape[1] < 16):
        s = tl.sum(a, axis=AXIS)
    elif AXIS == 0:  # [16, C]: every row the sums; one kept by a select (a product with 0 would turn Inf into NaN)
        s = tl.sum(tl.where(tl.arange(0, 16)[:, None] == 0, tl.dot(tl.full((16, x.shape[0]), 1.0, tl.float64), a),
                            0.0), axis=0)
    else:
        s = tl.sum(tl.where(tl.arange(0, 16)[None, :] == 0, tl.dot(a, tl.full((x.shape[1], 16), 1.0, tl.float64)),
                            0.0), axis=1)
    return s


@triton.jit
def dual_axis_codes(x, QMAX: tl.constexpr, COLS: tl.constexpr):
    """`dual_axis_fit` of x [R, C], a whole oriented head (padding zero) of COLS columns, from its own row sums."""
    return dual_axis_fit(x, dual_axis_row_sums(x), QMAX, COLS)


@triton.jit
def dual_axis_fit(x, sums, QMAX: tl.constexpr, COLS: tl.constexpr):
    """STEPQuant's codes of x [R, C] (padding zero), whole rows of an oriented head of COLS columns or a slab of its
    columns, given sums [R, 1], the FP64 sums of |x| along each of the head's rows (`dual_axis_row_sums`): row factors
    r = F(sqrt(sums / COLS)) [R, 1], column factors c0 = F(max |x| / r / QMAX) [1, C], codes z0 = clip(RNE(x / (r c0))),
    the fixed-code update c = F(sum v x / sum v^2) (v = r z0; c0 where the sum is 0) and the codes z = clip(RNE(x /
    (r c))). Returns (z [R, C] FP32 integers, 0 for NaN; r [R, 1]; c [1, C]; bad [1, 1], non-zero where the head
    holds Inf or NaN: a row sum that is not finite). r c is exact in FP32 (a product of two FP16 values). The mean,
    sqrt, sums and the update's quotient are FP64 as in the torch format (IEEE division and square root: `div.rn.f64`,
    `sqrt.rn.f64` on a GPU), the other quotients IEEE FP32 divisions (`div.rn.f32`); the sums run in another order
    than torch's, which changes a factor only where an FP64 sum lies within its last bits of an FP32 rounding
    boundary."""
    bad = tl.max(((sums != sums) | (sums == float("inf"))).to(tl.int32), axis=0, keep_dims=True)  # [1, 1]
    zero = tl.zeros_like(x)
    r = fp16_factor(tl.sqrt(sums / COLS).to(tl.float32))  # [R, 1]
    wide = tl.max(tl.math.div_rn(tl.abs(x), r + zero), axis=0, keep_dims=True)  # [1, C] max_i |x_ij| / r_i
    # fl32(wide / q) is the torch format's FP32 rounding of its FP64 quotient: a double rounding of a quotient from
    # 53 to 24 bits never differs from the single one (53 >= 2 * 24 + 2)
    c0 = fp16_factor(tl.math.div_rn(wide, tl.full(wide.shape, QMAX, tl.float32)))
    v = (r * round_int(tl.math.div_rn(x, (r * c0) + zero), QMAX)).to(tl.float64)  # [R, C] r_i z0_ij, exact
    num = tl.sum(v * x.to(tl.float64), axis=0, keep_dims=True)  # [1, C]
    den = tl.sum(v * v, axis=0, keep_dims=True)
    c = tl.where(den > 0, fp16_factor((num / tl.where(den > 0, den, 1.0)).to(tl.float32)), c0)
    return round_int(tl.math.div_rn(x, (r * c) + zero), QMAX), r, c, bad


@triton.jit
def sub_rn(a, b):
    """a - b in FP32, rounded once by itself. A GPU compiler contracts a - p * q into one FMA where b = p * q is a
    decoded value (codes times scale), which skips b's rounding: `sub.rn.f32` has an explicit rounding mode, which
    the compiler never contracts (`mul` + `sub.rn`, not `fma`, in sm_90's SASS). The interpreter subtracts as is."""
    if _INTERPRETED:
        d = a - b
    else:
        d = tl.inline_asm_elementwise("sub.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True,
                                      pack=1)
    return d


@triton.jit
def feedback_target(x, e, EF: tl.constexpr):
    """What a copy with error feedback (EF: `Residual`) rounds: the state x plus its residual e; x itself without
    feedback (no add: x's zeros keep their sign)."""
    if EF != RESIDUAL_NONE:
        x = x + e
    return x


@triton.jit
def feedback_residual(target, stored, EF: tl.constexpr):
    """The residual a copy with error feedback keeps after rounding target to stored (`Feedback.residual`): their
    difference in FP32 (RESIDUAL_FP32) or rounded to BF16 (RESIDUAL_BF16, RNE)."""
    e = sub_rn(target, stored)
    if EF == RESIDUAL_BF16:
        e = round_bf16(e)
    return e


@triton.jit
def nvfp4_tile(x, amax, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """NVFP4 of x [BLOCK_R, BLOCK_C] in TransformerEngine's order of operations (amax [BLOCK_R, 1]).

    Returns q [BLOCK_R, BLOCK_C // 16, 16] E2M1 values, s_b [BLOCK_R, BLOCK_C // 16] E4M3 block
    scales and s_dec [BLOCK_R, 1]; the value is (q * s_b) * s_dec.
    """
    s_enc = tl.math.div_rn(tl.full(amax.shape, _NVFP4_AMAX, tl.float32), amax)
    s_enc = tl.where(s_enc > _FLT_MAX, _FLT_MAX, s_enc)
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    s_dec = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), s_enc)
    xb = tl.reshape(x, (BLOCK_R, BLOCK_C // _NVFP4_BLOCK, _NVFP4_BLOCK))
    bmax = tl.max(tl.abs(xb), axis=2)  # [BLOCK_R, BLOCK_C // 16]
    s_b = round_e4m3(bmax * (s_enc * _F32_SIXTH))
    enc_b = tl.math.div_rn(tl.full(s_b.shape, 1.0, tl.float32), s_b * s_dec)
    enc_b = tl.where(enc_b > _FLT_MAX, _FLT_MAX, enc_b)
    v = xb * enc_b[:, :, None]
    q = tl.where(v == 0.0, 0.0, round_e2m1(v))  # a zero (-0.0 included) is code 0
    return q, s_b, s_dec


@triton.jit
def group_scale(amax, MAX: tl.constexpr):
    """Scale s = amax / MAX of a scaled elementwise kind, 1 for an all-zero group (NaN and Inf kept)."""
    s = tl.math.div_rn(amax, tl.full(amax.shape, MAX, tl.float32))
    return tl.where(s == 0.0, 1.0, s)


@triton.jit
def scale_elements(x, amax, KIND: tl.constexpr, GROUP: tl.constexpr, MAX: tl.constexpr, ORDER: tl.constexpr):
    """(v, s): the elements x [R, C] of a scaled elementwise kind ready to round, and their decode scale [R, 1] from
    the amax [R, 1] of each row's group (or [R, C], each element's tile) in the operand order ORDER
    (`ScaledFormat._scaled`; s = 1 without a group).
    Under ORDER_MUL an integer kind codes NaN as -MAX."""
    if GROUP == GROUP_NONE:
        v = x
        s = tl.full(amax.shape, 1.0, tl.float32)
    elif ORDER == ORDER_MUL:
        enc = tl.where(amax == 0.0, 1.0, tl.math.div_rn(tl.full(amax.shape, MAX, tl.float32), amax))
        v = x * enc
        s = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), enc)
    else:
        s = group_scale(amax, MAX)
        v = tl.math.div_rn(x, s + tl.zeros_like(x))
    if ORDER == ORDER_MUL:
        if (KIND == INT8) | (KIND == INT16) | (KIND == INT8SR) | (KIND == INT16SR):
            v = tl.where(v != v, -MAX, v)
    return v, s


@triton.jit
def quantize_tile(x, bits, amax, KIND: tl.constexpr, GROUP: tl.constexpr, MAX: tl.constexpr, ORDER: tl.constexpr,
                  BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """`fmt.quantize` of a tile x [BLOCK_R, BLOCK_C] of format rows, blocks running along C (a `KernelCodec`'s
    kind, group, max and order).

    bits: [BLOCK_R, BLOCK_C] random fields (SR kinds, `sr_field`); amax: [BLOCK_R, 1] amax of each row's global-scale
    group (NVFP4's S_enc; the scale amax / MAX of an elementwise kind with a group), [BLOCK_R, BLOCK_C] each
    element's for GROUP_TILE. GROUP_ROWCOL rounds as GROUP_ROW: x is already divided by its column factors, which the
    caller multiplies back (`round_tile`). Padding must be zero (it never raises a block max); an MX block longer than
    BLOCK_C is the whole padded row.
    """
    if KIND == NVFP4:
        q, s_b, s_dec = nvfp4_tile(x, amax, BLOCK_R, BLOCK_C)
        y = tl.reshape((q * s_b[:, :, None]) * s_dec[:, :, None], (BLOCK_R, BLOCK_C))
    elif (KIND == MXFP8) or (KIND == MXFP4):
        q, scale, _ = mx_elements(x, KIND, BLOCK_R, BLOCK_C)
        y = tl.reshape(q * scale[:, :, None], (BLOCK_R, BLOCK_C))
    elif (KIND == MX8) or (KIND == MX8SR):
        y = mx8_tile(x, bits, KIND == MX8SR, BLOCK_R, BLOCK_C)
    else:
        v, s = scale_elements(x, amax, KIND, GROUP, MAX, ORDER)
        y = round_kind(v, bits, KIND)
        if GROUP != GROUP_NONE:
            y = y * s
    return y


@triton.jit
def mx_elements(x, KIND: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """MXFP8 / MXFP4 of x [BLOCK_R, BLOCK_C] (`MXFormat`: blocks of MB = min(32, BLOCK_C) along C, padding zero):
    (q [BLOCK_R, NB, MB] the rounded elements x / X on the E4M3 / E2M1 grid, NaN throughout a block holding Inf or
    NaN; X [BLOCK_R, NB], exact FP32; code [BLOCK_R, NB] int32, X's E8M0 byte, 255 for such a block)."""
    MB: tl.constexpr = _MX_BLOCK if _MX_BLOCK < BLOCK_C else BLOCK_C
    xb = tl.reshape(x, (BLOCK_R, BLOCK_C // MB, MB))
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
    q = tl.where(bad[:, :, None] != 0, float("nan"), q)
    return q, scale, tl.where(bad != 0, 255, code)


@triton.jit
def mx8_codes(x, fields, SR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Pimba's MX8 codes of x [BLOCK_R, BLOCK_C] (`MicroexponentFormat`: blocks of 16 along C share the exponent E,
    pairs the microexponent mu; padding zero; a block longer than BLOCK_C is the whole padded row), bit for bit, in
    32-bit integers: |x| = mant * 2^(e - 23), m = floor(|x| / 2^(E - mu - 5) + 1/2) = floor(mant / 2^d + 1/2) with
    d = 23 - e + E - mu - 5 >= 17: (mant + 2^(d - 1)) >> d (0 from d = 25 on). SR: m = floor(mant / 2^d + f / 2^32),
    f the 32-bit random field (`sr_field`): mant >> d plus the carry of f + the bits of mant below 2^d, placed at the
    top of 32 bits. Zeros and subnormals read e = -127 in the maxima, below every E >= -126, as the torch form's. A
    block holding Inf or NaN (bad) codes as the torch form's: m = 0 and mu = 1 throughout, E = -126.

    Returns (m [BLOCK_R, NB, MB // 2, 2] int32, neg (x < 0 and m > 0, alike), mu [BLOCK_R, NB, MB // 2, 1] int32,
    E [BLOCK_R, NB, 1, 1] int32, bad alike), NB = BLOCK_C // MB blocks of MB = min(16, BLOCK_C)."""
    tl.static_assert(_MX8_SR_FIELD == 32, "MX8's random field fills a 32-bit word")
    MB: tl.constexpr = _MX8_BLOCK if _MX8_BLOCK < BLOCK_C else BLOCK_C
    u = tl.reshape(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, (BLOCK_R, BLOCK_C // MB, MB // 2, 2))
    field = u >> 23
    e = field - 127  # floor(log2 |x|) of a normal x; -127 for zeros and subnormals, 128 for Inf and NaN
    pair = tl.max(e, axis=3)  # [BLOCK_R, BLOCK_C // MB, MB // 2]
    top = tl.max(pair, axis=2)[:, :, None, None]  # [BLOCK_R, BLOCK_C // MB, 1, 1]
    bad = (top == 128).to(tl.int32)  # the block holds Inf or NaN: only they reach 128
    big = tl.where(bad != 0, -126, tl.where(top < -126, -126, top))
    mu = tl.where(bad != 0, 1, (pair[:, :, :, None] < big).to(tl.int32))  # [BLOCK_R, BLOCK_C // MB, MB // 2, 1]
    mant = tl.where(field == 0, u & 0x7FFFFF, (u & 0x7FFFFF) | 0x800000)
    d = 23 - tl.where(field == 0, -126, e) + big - mu - _MX8_MANTISSA + 1  # >= 17 outside bad blocks
    d = tl.where(d < 17, 17, d)  # a bad block's codes are 0 whatever d: this d keeps its shifts in range
    if SR:
        f = tl.reshape(fields.to(tl.uint32), (BLOCK_R, BLOCK_C // MB, MB // 2, 2))
        below = tl.where(d < 32, mant.to(tl.uint32) << tl.where(d < 32, 32 - d, 0).to(tl.uint32),
                         mant.to(tl.uint32) >> tl.where(d < 56, d - 32, 24).to(tl.uint32))  # mant's bits below 2^d
        m = (mant >> tl.where(d < 24, d, 24)) + (below > (f ^ 0xFFFFFFFF)).to(tl.int32)  # the carry: below + f >= 2^32
    else:
        d = tl.where(d > 25, 25, d)
        m = (mant + (1 << (d - 1))) >> d
    m = tl.where(bad != 0, 0, tl.where(m > _MX8_QMAX, _MX8_QMAX, m)).to(tl.int32)
    neg = tl.reshape(x < 0.0, (BLOCK_R, BLOCK_C // MB, MB // 2, 2)) & (m > 0)
    return m, neg, mu, big, bad


@triton.jit
def mx8_tile(x, fields, SR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Pimba's MX8 of x [BLOCK_R, BLOCK_C] (`mx8_codes`, `mx8_values`), bit for bit."""
    m, neg, mu, big, bad = mx8_codes(x, fields, SR, BLOCK_R, BLOCK_C)
    return mx8_values(m, neg, mu, big, bad, BLOCK_R, BLOCK_C)


@triton.jit
def mx8_values(m, neg, mu, big, bad, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """[BLOCK_R, BLOCK_C] values of `mx8_codes`' fields: +-m * 2^(E - mu - 5) (subnormal below 2^-126), NaN
    throughout a block holding Inf or NaN."""
    a = big - mu - _MX8_MANTISSA + 1  # log2 of the step, >= -132
    # m * 2^a, a in [-132, 122], as two exact products by powers of two in FP32's normal range: m * 2^(a >> 1) is
    # normal, and m < 2^6 times 2^a >= 2^-132 lies on FP32's grid (subnormals included), so neither rounds
    q = tl.where(neg, -m, m).to(tl.float32) * _pow2(a >> 1) * _pow2(a - (a >> 1))
    return tl.reshape(tl.where(bad != 0, float("nan"), q), (BLOCK_R, BLOCK_C))


@triton.jit
def mx8_bytes(m, neg, mu, big, bad, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """`MicroexponentFormat`'s packed bytes [BLOCK_R, BLOCK_C] (int32) of `mx8_codes`' fields: byte b = sign << 6 | m,
    bit 7 of byte 2j pair j's microexponent, of byte 2j+1 bit j of the exponent field (E + 127, 255 for a bad
    block)."""
    MB: tl.constexpr = _MX8_BLOCK if _MX8_BLOCK < BLOCK_C else BLOCK_C
    field = tl.where(bad != 0, 255, big + 127)  # [BLOCK_R, NB, 1, 1]
    j = tl.arange(0, MB // 2)[None, None, :, None]
    lane = tl.arange(0, 2)[None, None, None, :]
    spare = tl.where(lane == 0, mu, (field >> j) & 1)  # [BLOCK_R, NB, MB // 2, 2]
    return tl.reshape(neg.to(tl.int32) << 6 | m | spare << 7, (BLOCK_R, BLOCK_C))


@triton.jit
def _butterfly(y, H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """One stage of `hadamard_tile`: the pairs (a, b) = (y[j], y[j + H]) of every block of 2H columns -> (a + b, a - b)."""
    t = tl.permute(tl.reshape(y, (BLOCK_R, BLOCK_C // (2 * H), 2, H)), (0, 1, 3, 2))  # [R, C / 2H, H, 2]
    a, b = tl.split(t)
    return tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), (BLOCK_R, BLOCK_C))


@triton.jit
def hadamard_tile(x, ROT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """x [BLOCK_R, BLOCK_C] (FP32) times H_ROT on each run of ROT columns (ROT a power of two dividing BLOCK_C, 1: x),
    in FP64 rounded to FP32, bit for bit `rotation.hadamard_runs`: the same butterfly stages, and its product by
    fp64(1 / sqrt(ROT)) = fp64(1 / sqrt(2))^(log2 ROT odd) * 2^-(log2 ROT // 2) taken as a halving after every second
    stage and a last product by fp64(1 / sqrt(2)) (powers of two scale FP64 values of FP32 range exactly). H_ROT is
    symmetric: the same call rotates back."""
    y = x.to(tl.float64)
    for i in tl.static_range(_ROT_STAGES):
        if 2**i < ROT:
            y = _butterfly(y, 2**i, BLOCK_R, BLOCK_C)
            if i % 2 == 1:
                y = y * tl.full((1, 1), 0.5, tl.float64)
            elif 2**(i + 1) == ROT:  # an odd number of stages
                y = y * tl.full((1, 1), _INV_SQRT2, tl.float64)
    return y.to(tl.float32)


@triton.jit
def round_tile(x, bits, KIND: tl.constexpr, GROUP: tl.constexpr, MAX: tl.constexpr, ORDER: tl.constexpr,
               ROWS: tl.constexpr, COLS: tl.constexpr, ROT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """`quantize_tile` of a tile x [BLOCK_R, BLOCK_C] of the oriented state (blocks along C) holding whole format rows
    (padding zero) whose scale groups lie inside it (`KernelCodec.in_tile`): a row's amax over C, a head's over the
    whole tile (GROUP_HEAD), a scale tile's over its ROWS x COLS (GROUP_TILE, `codec.tile`: the program holds whole
    tiles, or the whole head where a tile is taller than BLOCK_R), a row's of x / c over C (GROUP_ROWCOL, the tile
    holding the whole head: y = x / c by the column factors c, its row scale, then (q * s) * c, in `ScaledFormat`'s
    and `NVFP4Format`'s order), or STEPQuant's factors of the whole head (GROUP_DUAL, `dual_axis_tile`: COLS the
    head's columns, MAX its q). ROT > 1: rotated by H_ROT along C before and rotated back after (`hadamard_tile`; the
    program holds whole runs, padding whole runs of zeros)."""
    if ROT > 1:
        x = hadamard_tile(x, ROT, BLOCK_R, BLOCK_C)
    if GROUP == GROUP_TILE:
        y = quantize_tile(x, bits, scale_tile_amax(x, ROWS, COLS, ORDER, BLOCK_R, BLOCK_C), KIND, GROUP, MAX, ORDER,
                          BLOCK_R, BLOCK_C)
    elif GROUP == GROUP_DUAL:
        y = dual_axis_tile(x, MAX, COLS)
    elif GROUP == GROUP_ROWCOL:
        col = column_factors(x)  # [1, BLOCK_C]
        xc = tl.math.div_rn(x, col + tl.zeros_like(x))  # x / c
        y = quantize_tile(xc, bits, tile_amax(xc, False, ORDER), KIND, GROUP, MAX, ORDER, BLOCK_R, BLOCK_C) * col
    else:
        y = quantize_tile(x, bits, tile_amax(x, GROUP == GROUP_HEAD, ORDER), KIND, GROUP, MAX, ORDER, BLOCK_R, BLOCK_C)
    if ROT > 1:
        y = hadamard_tile(y, ROT, BLOCK_R, BLOCK_C)
    return y


@triton.jit
def round_state_tile(x, bits, KIND: tl.constexpr, GROUP: tl.constexpr, MAX: tl.constexpr, ORDER: tl.constexpr,
                     ROWS: tl.constexpr, COLS: tl.constexpr, AXIS: tl.constexpr, ROT: tl.constexpr,
                     BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """`round_tile` of a state tile x [BLOCK_P, BLOCK_N] (rows head_dim, columns d_state; bits alike) in the format's
    orientation: as it lies (AXIS_DSTATE) or transposed to [BLOCK_N, BLOCK_P] (AXIS_HEADDIM)."""
    if AXIS == AXIS_HEADDIM:
        xt, bt = tl.trans(x), tl.trans(bits)  # [BLOCK_N, BLOCK_P]: format rows are d_state indices
        y = tl.trans(round_tile(xt, bt, KIND, GROUP, MAX, ORDER, ROWS, COLS, ROT, BLOCK_N, BLOCK_P))
    else:
        y = round_tile(x, bits, KIND, GROUP, MAX, ORDER, ROWS, COLS, ROT, BLOCK_P, BLOCK_N)
    return y


@triton.jit
def _mul_hi_lo(a, M: tl.constexpr):
    """(high, low) uint32 halves of a * M (a uint32, M a 32-bit constant) from one 64-bit product: one IMAD.WIDE on an
    NVIDIA GPU, where `umulhi` and a 32-bit product are two instructions."""
    p = a.to(tl.uint64) * M
    return (p >> 32).to(tl.uint32), p.to(tl.uint32)


@triton.jit
def philox4x32(seed, counter, N_ROUNDS: tl.constexpr = 10):
    """The four uint32 words of `tl.randint4x(seed, counter, N_ROUNDS)`, bit for bit (Philox4x32-N_ROUNDS at counter
    (low, high 32 bits of counter, 0, 0), key (low, high 32 bits of seed)), each round's two products taken as
    `_mul_hi_lo`: about a fifth fewer instructions than `tl.randint`'s on sm_90. `tl.randint` is word 0."""
    s = seed.to(tl.uint64)
    k0 = (s & 0xFFFFFFFF).to(tl.uint32)
    k1 = (s >> 32).to(tl.uint32)
    c0 = counter.to(tl.uint32)
    if tl.constexpr(counter.dtype.primitive_bitwidth) > 32:
        c1 = (counter >> 32).to(tl.uint32)
    else:
        c1 = c0 * 0
    c2 = c0 * 0
    c3 = c0 * 0
    for _ in tl.static_range(N_ROUNDS):
        hi_b, lo_b = _mul_hi_lo(c2, _PHILOX_ROUND_B)
        hi_a, lo_a = _mul_hi_lo(c0, _PHILOX_ROUND_A)
        c0 = hi_b ^ c1 ^ k0
        c2 = hi_a ^ c3 ^ k1
        c1 = lo_b
        c3 = lo_a
        k0 = tl.add(k0, _PHILOX_KEY_A, sanitize_overflow=False)
        k1 = tl.add(k1, _PHILOX_KEY_B, sanitize_overflow=False)
    return c0, c1, c2, c3


@triton.jit
def philox_word(seed, counter, N_ROUNDS: tl.constexpr = 10):
    """Word 0 of `philox4x32`: `tl.randint(seed, counter, N_ROUNDS)`, bit for bit."""
    word, _, _, _ = philox4x32(seed, counter, N_ROUNDS)
    return word


@triton.jit
def pair_odd(col, WORDS: tl.constexpr):
    """1 (int64) for the element 2j+1 of a pair under the paired layouts (WORDS_PAIR, WORDS_OCTET), which reads bits
    [28:16] of the word of element 2j, its counter less 1; 0 elsewhere (col: the element's index along the last dim)."""
    if (WORDS == WORDS_PAIR) | (WORDS == WORDS_OCTET):
        odd = (col & 1).to(tl.int64)
    else:
        odd = (col * 0).to(tl.int64)
    return odd


@triton.jit
def sr_field(word, KIND: tl.constexpr, BITS: tl.constexpr):
    """The random field (uint32) the roundings of the stochastic kind KIND read from an element's 32-bit word: its
    bits [BITS-1:0] shifted to the top of the kind's field (module docstring)."""
    FIELD: tl.constexpr = _FP16_SR_BITS if (KIND == FP16SR) | (KIND == FP16SR_SOFT) else (
        _E4M3_SR_FIELD if KIND == FP8SR else (_MX8_SR_FIELD if KIND == MX8SR else _INT_SR_FIELD))
    tl.static_assert(BITS >= 1, "a stochastic kind takes at least one random bit")
    w = word.to(tl.uint32)
    if BITS < 32:
        w = w & (2**BITS - 1)
    return w << (FIELD - BITS)


@triton.jit
def _group_words(key, counter, WORDS: tl.constexpr, N_ROUNDS: tl.constexpr, COLS_FIRST: tl.constexpr):
    """uint32 words of a 2-D tile of counters, its columns along its last dim or, where COLS_FIRST, its first, holding
    whole groups of G = 2 (WORDS_PAIR, WORDS_DUO), 4 (WORDS_QUAD) or 8 (WORDS_OCTET) columns from a multiple of G:
    one Philox call per group at its first counter. WORDS_PAIR: the call's word 0 for 2j and word 0 >> 16 for 2j+1;
    WORDS_DUO, WORDS_QUAD: word n % G; WORDS_OCTET: words r0, r2, r1, r3 to the group's four pairs, each split as
    a pair's."""
    c = tl.trans(counter) if COLS_FIRST else counter
    R: tl.constexpr = c.shape[0]
    C: tl.constexpr = c.shape[1]
    if WORDS == WORDS_PAIR:
        first, _ = tl.split(tl.reshape(c, [R, C // 2, 2]))  # [R, C / 2] each pair's first counter
        word = philox_word(key, first, N_ROUNDS)
        words = tl.join(word, word >> 16)
    elif WORDS == WORDS_DUO:
        first, _ = tl.split(tl.reshape(c, [R, C // 2, 2]))
        r0, r1, _, _ = philox4x32(key, first, N_ROUNDS)
        words = tl.join(r0, r1)
    elif WORDS == WORDS_QUAD:
        first, _ = tl.split(tl.reshape(c, [R, C // 4, 2, 2]))
        first, _ = tl.split(first)  # [R, C / 4]
        r0, r1, r2, r3 = philox4x32(key, first, N_ROUNDS)
        words = tl.join(tl.join(r0, r2), tl.join(r1, r3))  # [R, C / 4, 2, 2]: r0, r1, r2, r3 in order
    else:
        first, _ = tl.split(tl.reshape(c, [R, C // 8, 2, 2, 2]))
        first, _ = tl.split(first)
        first, _ = tl.split(first)  # [R, C / 8]
        r0, r1, r2, r3 = philox4x32(key, first, N_ROUNDS)
        quad = tl.join(tl.join(r0, r1), tl.join(r2, r3))  # [R, C / 8, 2, 2]: r0, r2, r1, r3 in order
        words = tl.join(quad, quad >> 16)  # each pair: the word, then its high field
    words = tl.reshape(words, [R, C])
    return tl.trans(words) if COLS_FIRST else words


@triton.jit
def _element_words(key, counter, col, WORDS: tl.constexpr, N_ROUNDS: tl.constexpr):
    """`_group_words` element by element, for any tile (col: each element's column): its group's Philox call at
    counter - (col % G), recomputed by every element of the group."""
    if (WORDS == WORDS_ELEMENT) | (WORDS == WORDS_PAIR):
        odd = pair_odd(col, WORDS)
        words = philox_word(key, counter - odd, N_ROUNDS) >> (odd * 16).to(tl.uint32)
    else:
        if WORDS == WORDS_DUO:
            pos = col % 2
            lane = pos
        elif WORDS == WORDS_QUAD:
            pos = col % 4
            lane = pos
        else:
            pos = col % 8
            lane = ((pos >> 1) & 1) * 2 + ((pos >> 2) & 1)  # (0, 0, 2, 2, 1, 1, 3, 3)[pos]
        r0, r1, r2, r3 = philox4x32(key, counter - pos, N_ROUNDS)
        words = tl.where(lane == 0, r0, tl.where(lane == 1, r1, tl.where(lane == 2, r2, r3)))
        words = words >> (pair_odd(col, WORDS) * 16).to(tl.uint32)
    return words


@triton.jit
def layout_bits(key, counter, col, KIND: tl.constexpr, RANDOM: tl.constexpr, N_ROUNDS: tl.constexpr,
                ALIGNED: tl.constexpr = True):
    """Random fields (uint32, `sr_field`) of a tile's elements for the stochastic kinds (zeros for the others), from
    Philox4x32-N_ROUNDS words in RANDOM's word layout (`Words`) under key (an int64 scalar) at counter (a 2-D int64
    tile: each element's counter): word 0 of its own call (WORDS_ELEMENT), or one call per group of G elements of a
    row at the first one's counter (`_group_words`). col: each element's column (its index along the state's last
    dim), [1, C] (columns along the tile's last dim) or [C, 1] (its first). A tile whose columns are whole groups
    from a multiple of G draws each group's call once; others draw it element by element (`_element_words`), as does
    a tile that is not ALIGNED: one whose columns do not start its rows' groups (the encoder's tile of several heads'
    d_state indices along its first dim, whose heads need not hold whole groups)."""
    WORDS: tl.constexpr = RANDOM[0]
    COLS_FIRST: tl.constexpr = col.shape[0] > 1
    N_COLS: tl.constexpr = col.shape[0] if COLS_FIRST else col.shape[-1]
    G: tl.constexpr = 1 if WORDS == WORDS_ELEMENT else (2 if (WORDS == WORDS_PAIR) | (WORDS == WORDS_DUO) else (
        4 if WORDS == WORDS_QUAD else 8))
    GROUPED: tl.constexpr = ALIGNED and G > 1 and N_COLS % G == 0  # each group's call drawn once
    if ((KIND == FP16SR) | (KIND == FP16SR_SOFT) | (KIND == FP8SR) | (KIND == INT8SR) | (KIND == INT16SR)
            | (KIND == MX8SR)):
        if GROUPED:
            words = _group_words(key, counter, WORDS, N_ROUNDS, COLS_FIRST)
        else:
            words = _element_words(key, counter, col, WORDS, N_ROUNDS)
        bits = sr_field(words, KIND, RANDOM[2])
    else:
        bits = tl.zeros(counter.shape, dtype=tl.uint32)
    return bits


@triton.jit
def state_bits(key, counter, col, KIND: tl.constexpr, RANDOM: tl.constexpr, ALIGNED: tl.constexpr = True):
    """Random fields of a stored copy's elements (`layout_bits` with Philox4x32-10 whatever RANDOM's ROUNDS), the
    words that `fmt.encode(x, random_bits=replay.keys.state_random_bits(..., fmt.lane_words))` reads. key: the copy's
    key; counter: (checkpoint << 32) + element index."""
    return layout_bits(key, counter, col, KIND, RANDOM, 10, ALIGNED)


@triton.jit
def seeded_bits(seed, counter, col, KIND: tl.constexpr, RANDOM: tl.constexpr):
    """Random fields of `fmt.quantize(x, seed=seed, offset=...)` (`layout_bits` with RANDOM's ROUNDS); counter:
    offset + flat index."""
    return layout_bits(seed, counter, col, KIND, RANDOM, RANDOM[1])


@triton.jit
def decode_elements(raw, KIND: tl.constexpr):
    """FP32 values of one packed row's elements of the elementwise kinds: FP8 bytes through FP16 bit patterns
    (`e4m3_fast`, `e5m2_fast`), the 16- and 32-bit kinds and the integer codes cast."""
    if (KIND == FP8) | (KIND == FP8SR):
        x = e4m3_fast(raw)
    elif KIND == FP8E5M2:
        x = e5m2_fast(raw)
    else:
        x = raw.to(tl.float32)
    return x

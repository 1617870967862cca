"""Engine presets against hand-written scalar ports of the engines' own roundings, bit for bit on awkward values.

Each port follows the engine's source as `docs/engine_numerics.md` describes it, element by element in plain
Python and NumPy float32 (never through `formats`); only the Philox generator is shared (`formats.philox`,
checked against Random123's known answers in tests/formats/test_philox.py). A preset marked "statistically
only" has a test that pins where it departs from the engine.
"""

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from replayssm_eval.formats import get_format, philox
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.engine_presets import PRESETS
from tests.helpers.compare import assert_bits_equal

FLT_MAX = np.float32(3.4028234663852886e38)
# awkward FP32 values for an FP16 store: zeros, FP32 and FP16 subnormals, the normal boundary, values on the
# FP16 grid and between it, the largest FP16 and past it, infinities and NaN
FP16_AWKWARD = [0.0, -0.0, 1e-40, -1e-40, 2.0**-24, 1.5 * 2.0**-24, 2.0**-20 + 2.0**-30, -(2.0**-15) * 1.75,
                2.0**-14, 2.0**-14 * (1 - 2.0**-23), 1.0, 1.0 + 2.0**-11, -(1.0 + 3 * 2.0**-12), 3.14159265,
                -2.718281828, 1000.3, 65504.0, 65504.0 + 15.99, -65519.0, 65520.0, 7e4, -1e30, math.inf,
                -math.inf, math.nan, 6.1e-5, -6.0e-5, 0.1, 1e-3]


def _f32(x) -> np.float32:
    return np.float32(x)


def _f16_from_bits(h: int) -> np.float16:
    return np.array([h], dtype=np.uint16).view(np.float16)[0]


def _philox_words(seed: int, counters: list[int], rounds: int) -> list[tuple[int, int, int, int]]:
    """Philox4x32 outputs at counters (lo, hi, 0, 0), as tl.randint4x and FlashInfer's philox_randint4x draw them."""
    c = torch.tensor(counters, dtype=torch.int64)
    zero = torch.zeros_like(c)
    words = philox.philox4x32(seed, c & 0xFFFFFFFF, c >> 32, zero, zero, rounds)
    return list(zip(*(w.tolist() for w in words)))


def ptx_cvt_rs_f16(x: float, r13: int) -> np.float16:
    """One operand of PTX cvt.rs.f16x2.f32: floor(|x| / q + r / 2^13) * q on the FP16 grid (q from x's binade,
    2^-24 below 2^-14), Inf beyond 65504 (no .satfinite), FP32 subnormal inputs to zero, signs kept."""
    x = float(_f32(x))
    if math.isnan(x) or math.isinf(x):
        return np.float16(x)
    a = Fraction(abs(x))
    y = Fraction(0)
    if a >= Fraction(2) ** -126:
        e = math.frexp(abs(x))[1] - 1
        q = Fraction(2) ** (max(e, -14) - 10)
        y = math.floor(a / q + Fraction(r13 & 0x1FFF, 2**13)) * q
    mag = math.inf if y > 65504 else float(y)
    return np.float16(math.copysign(mag, x))


def soft_cvt_rs_f16(x: float, r13: int) -> np.float16:
    """FlashInfer's cvt_rs_f16_sw: the noise added to |x|'s uint32 bit pattern, the low 13 bits truncated,
    FP32 exponents below 113 flushed to zero and above 142 to Inf, exponent 255 to Inf or NaN by its mantissa."""
    bits = struct.unpack("<I", struct.pack("<f", float(_f32(x))))[0]
    a = ((bits & 0x7FFFFFFF) + (r13 & 0x1FFF)) & 0xFFFFFFFF
    exp, man = (a >> 23) & 0xFF, a & 0x7FFFFF
    if exp == 0xFF:
        h = 0x7E00 if man else 0x7C00
    elif exp > 142:
        h = 0x7C00
    elif exp < 113:
        h = 0
    else:
        h = ((exp - 112) << 10) | (man >> 13)
    return _f16_from_bits(((bits & 0x80000000) >> 16) | h)


def vllm_store(state: np.ndarray, seed: int, rounds: int, base: int) -> np.ndarray:
    """vLLM's fp16 SR store of one cache slot [H, P, N] at element offset `base`: tl.randint(seed, offset) per
    element, convert_rs_fp16x2 (`cvt.rs.f16x2.f32 $0, $2, $1, $3` with pack=2) on consecutive pairs along N:
    element n (PTX b, low half) reads bits [12:0], n + 1 (PTX a, high half) bits [28:16] of n's word."""
    h, p, n = state.shape
    out = np.empty(state.shape, np.float16)
    rows = [(i, j) for i in range(h) for j in range(p)]
    offsets = [base + (i * p + j) * n + c for i, j in rows for c in range(0, n, 2)]
    words = iter(w[0] for w in _philox_words(seed, offsets, rounds))
    for i, j in rows:
        for c in range(0, n, 2):
            word = next(words)
            out[i, j, c] = ptx_cvt_rs_f16(state[i, j, c], word & 0x1FFF)
            if c + 1 < n:
                out[i, j, c + 1] = ptx_cvt_rs_f16(state[i, j, c + 1], (word >> 16) & 0x1FFF)
    return out


def trtllm_replay_store(state: np.ndarray, seed: int, rounds: int, base: int) -> np.ndarray:
    """TensorRT-LLM's ReplaySSM flush storing one fp16 cache slot [H, P, N]: per row, tl.randint4x at the offsets of
    elements 0, 8, 16, ...; tl.join(tl.join(r0, r1), tl.join(r2, r3)) reshaped to one word per pair, each word
    broadcast to its pair, then convert_rs_fp16x2 (pack=2) as vLLM's store."""
    h, p, n = state.shape
    out = np.empty(state.shape, np.float16)
    for i in range(h):
        for j in range(p):
            row = base + (i * p + j) * n
            r = np.array(_philox_words(seed, [row + 8 * q for q in range(n // 8)], rounds), dtype=np.int64)  # [Q, 4]
            r01, r23 = np.stack((r[:, 0], r[:, 1]), -1), np.stack((r[:, 2], r[:, 3]), -1)
            rand = np.repeat(np.stack((r01, r23), -1).reshape(-1), 2)  # [N]: one word per pair, on both elements
            for c in range(0, n, 2):
                out[i, j, c] = ptx_cvt_rs_f16(state[i, j, c], int(rand[c]) & 0x1FFF)
                out[i, j, c + 1] = ptx_cvt_rs_f16(state[i, j, c + 1], (int(rand[c]) >> 16) & 0x1FFF)
    return out


def flashinfer_store(state: np.ndarray, seed: int, rounds: int, base: int, cvt, count: int | None = None) -> np.ndarray:
    """FlashInfer's decode kernels storing one fp16 cache slot [H, P, N] (`base` = slot * stride): per row d a warp
    of 32 lanes takes `count` elements at a time (the simple kernel's vector load, min(8, N / 32); the SM90 vertical
    kernel's shared-memory bank, 2); every 4th element of a load calls philox_randint4x(seed, state_ptr_offset +
    d * N + i + ii) and element ii reads word ii % 4, bits [12:0]."""
    h, p, n = state.shape
    count = min(8, n // 32) if count is None else count
    out = np.empty(state.shape, np.float16)
    for head in range(h):
        state_ptr_offset = base + head * p * n
        for d in range(p):
            for lane in range(32):
                for i in range(lane * count, n, 32 * count):
                    for ii in range(count):
                        if ii % 4 == 0:
                            rand_ints = _philox_words(seed, [state_ptr_offset + d * n + i + ii], rounds)[0]
                        out[head, d, i + ii] = cvt(state[head, d, i + ii], rand_ints[ii % 4] & 0x1FFF)
    return out


def flashinfer_int16_row(row: np.ndarray) -> tuple[list[int], np.float32]:
    """FlashInfer's INT16 scaled state of one row (correctly rounded divisions): warp max by fmaxf from -FLT_MAX,
    enc = 32767 / max (1 where max == 0), code = __float2int_rn(fminf(fmaxf(x * enc, -32767), 32767)), dec = 1 / enc."""
    with np.errstate(all="ignore"):
        m = -FLT_MAX
        for v in row:
            m = np.fmax(m, np.abs(_f32(v)))
        enc = _f32(1) if m == 0 else _f32(32767) / m
        codes = [int(np.rint(np.fmin(np.fmax(_f32(v) * enc, _f32(-32767)), _f32(32767)))) for v in row]
        return codes, _f32(1) / enc


def _preset_format(name: str):
    return ReplayConfig.parse(name).read_format


def _state(shape: tuple[int, int, int], seed: int, awkward: list[float]) -> torch.Tensor:
    """A state of `shape` with N(0, 1) * 100 values and the awkward values scattered over it."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 100
    flat = x.view(-1)
    where = torch.randperm(flat.numel(), generator=g)[:len(awkward)]
    flat[where] = torch.tensor(awkward, dtype=torch.float32)
    return x


@pytest.mark.parametrize("name", ["vllm:fp16sr", "sglang:fp16sr", "vllm:replay-fp16sr"])
@pytest.mark.parametrize("seed,d_state", [(0, 10), (12345, 11), (2**40 + 7, 10)])
def test_vllm_triton_store(name, seed, d_state):
    """An odd d_state leaves each row's last element unpaired (its partner is the masked padding)."""
    fmt = _preset_format(name)
    x = _state((2, 3, d_state), seed % 1000, FP16_AWKWARD)
    slot, slot_size = 5, x.numel()
    got = fmt.quantize(x, seed=seed, offset=slot * slot_size)
    want = vllm_store(x.numpy(), seed, 10, slot * slot_size)
    assert_bits_equal(got, torch.from_numpy(want.astype(np.float32)))


@pytest.mark.parametrize("name,cvt", [("flashinfer:fp16sr", ptx_cvt_rs_f16), ("trtllm:fp16sr", ptx_cvt_rs_f16),
                                      ("flashinfer:fp16sr-sm90", soft_cvt_rs_f16)])
@pytest.mark.parametrize("d_state", [128, 256])
def test_flashinfer_store(name, cvt, d_state):
    fmt = _preset_format(name)
    x = _state((1, 2, d_state), d_state, FP16_AWKWARD)
    got = fmt.quantize(x, seed=99, offset=3 * x.numel())
    want = flashinfer_store(x.numpy(), 99, 10, 3 * x.numpy().size, cvt)
    assert_bits_equal(got, torch.from_numpy(want.astype(np.float32)))


@pytest.mark.parametrize("d_state", [16, 64])
def test_trtllm_replay_store(d_state):
    fmt = _preset_format("trtllm:replay-fp16sr")
    x = _state((2, 3, d_state), d_state, FP16_AWKWARD)
    got = fmt.quantize(x, seed=2024, offset=7 * x.numel())
    want = trtllm_replay_store(x.numpy(), 2024, 10, 7 * x.numel())
    assert_bits_equal(got, torch.from_numpy(want.astype(np.float32)))


@pytest.mark.parametrize("spec,cvt", [("fp16sr:words=duo", ptx_cvt_rs_f16), ("fp16sr:words=duo,cvt=soft", soft_cvt_rs_f16)])
@pytest.mark.parametrize("d_state,count", [(64, None), (128, 2)])
def test_flashinfer_two_element_loads(spec, cvt, d_state, count):
    """The simple kernel at d_state 64 and the SM90 vertical kernel (count 2) start a Philox call every 2 elements:
    `words=duo`, which the presets' `words=quad` is not."""
    x = _state((1, 2, d_state), 1, FP16_AWKWARD)
    want = torch.from_numpy(flashinfer_store(x.numpy(), 5, 10, 0, cvt, count).astype(np.float32))
    assert_bits_equal(get_format(spec).quantize(x, seed=5), want)
    quad = _preset_format("flashinfer:fp16sr").quantize(x, seed=5)
    assert (quad != want)[torch.isfinite(want)].any()  # elements 4k + 2 read word 2 of a call at 4k, not word 0 of one at 4k + 2


def test_soft_port_flushes_and_poisons_infinities():
    """The software port flushes fp16 subnormal results and turns Inf into NaN for any nonzero noise."""
    fmt = _preset_format("flashinfer:fp16sr-sm90")
    x = torch.tensor([[[2.0**-16, -(2.0**-20 + 2.0**-30), math.inf, 65520.0]]])
    words = torch.tensor([[[0x1FFF, 0x1FFF, 1, 0x1000]]])
    got = fmt.quantize(x, random_bits=words)
    assert got[0, 0, :2].tolist() == [0.0, -0.0] and torch.signbit(got[0, 0, 1])
    assert math.isnan(got[0, 0, 2]) and got[0, 0, 3] == math.inf
    ptx = _preset_format("flashinfer:fp16sr").quantize(x, random_bits=words)
    assert ptx[0, 0].tolist() == [2.0**-16, -(2.0**-20) - 2.0**-24, math.inf, math.inf]


def test_pairs_share_the_even_word():
    """Element 2j+1 rounds with bits [28:16] of element 2j's word; its own word is never read."""
    fmt = _preset_format("vllm:fp16sr")
    x = torch.full((1, 1, 6), 1.0 + 2.0**-11)  # halfway between two FP16 values: bit 12 of the field decides
    words = torch.tensor([[[0x1000, 0xFFFFFFFF, 0x10000000, 0, 0, 0x1FFF]]])
    y = fmt.quantize(x, random_bits=words)
    up, down = 1.0 + 2.0**-10, 1.0
    assert y[0, 0].tolist() == [up, down, down, up, down, down]
    words[0, 0, 1::2] = 0x12345678  # odd elements' own words do not matter
    assert torch.equal(fmt.quantize(x, random_bits=words), y)


@pytest.mark.parametrize("name", ["vllm:fp16sr", "flashinfer:fp16sr", "trtllm:replay-fp16sr"])
def test_counter_is_the_cache_offset(name):
    """Encoding the whole cache at offset 0 equals encoding each slot at its own offset; the seed reproduces it."""
    fmt = _preset_format(name)
    cache = _state((3, 2, 4, 8), 4, [])  # [slots, H, P, N]
    whole = fmt.quantize(cache, seed=77)
    per_slot = torch.stack([fmt.quantize(cache[s], seed=77, offset=s * cache[s].numel()) for s in range(3)])
    assert torch.equal(whole, per_slot)
    assert torch.equal(fmt.quantize(cache, seed=77), whole)
    assert not torch.equal(fmt.quantize(cache, seed=78), whole)
    assert not torch.equal(fmt.quantize(cache[1], seed=77), whole[1])  # slot 1 at offset 0 draws slot 0's words


INT16_ROWS = [
    [2.5, -2.5, 3.5, 32767.0, 0.5, -0.5, 1.5, -32766.5],  # amax 32767: enc = 1, ties to even
    [0.0, -0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # all zero: enc = 1
    [1e-40, -1e-41, 3e-39, 0.0, 1e-45, -2e-40, 0.0, 5e-39],  # FP32 subnormals only
    [1.0, math.nan, -3.0, 0.25, math.nan, 2.0, -1.0, 0.0],  # NaN: skipped by the max, code -32767
    [1.0, math.inf, -3.0, 0.25, 7.0, 2.0, -1.0, 0.0],  # Inf: enc = 0, dec = Inf
    [math.nan] * 8,  # all NaN: max stays -FLT_MAX
    [3.0, -3.0, 3.0 * (1 - 2.0**-24), 1e-30, 65504.0, 1.0, 2.0, 0.1],  # values near the int16 limit
    [1e30, -3e38, 1e-30, 7.0, -7.0, 2.0**100, 0.5, 1.0],  # huge range
]


def test_flashinfer_int16_operand_order():
    fmt = _preset_format("flashinfer:int16")
    x = torch.tensor(INT16_ROWS, dtype=torch.float32).view(1, len(INT16_ROWS), 8)  # [H, P, N]: one row per case
    packed = fmt.encode(x)
    for r, row in enumerate(INT16_ROWS):
        codes, dec = flashinfer_int16_row(np.array(row, dtype=np.float32))
        assert packed.data[0, r].tolist() == codes, f"row {r}"
        assert_bits_equal(packed.global_scale[0, r], torch.tensor(dec))
    with np.errstate(all="ignore"):
        want = [[_f32(c) * flashinfer_int16_row(np.array(row, np.float32))[1] for c in
                 flashinfer_int16_row(np.array(row, np.float32))[0]] for row in INT16_ROWS]
    assert_bits_equal(fmt.decode(packed), torch.tensor(np.array(want, np.float32)).view(x.shape))


def test_int16_default_order_differs_from_flashinfer():
    """The default int16 divides by amax / 32767: on random rows its scales and some codes differ from FlashInfer's."""
    x = torch.randn(1, 512, 128, generator=torch.Generator().manual_seed(0))
    div, mul = _preset_format("vllm:int16").encode(x), _preset_format("flashinfer:int16").encode(x)
    scales_differ = (div.global_scale != mul.global_scale).float().mean().item()
    codes_differ = (div.data != mul.data).float().mean().item()
    assert 0.05 < scales_differ < 0.6 and 0 < codes_differ < 0.01, (scales_differ, codes_differ)


@pytest.mark.parametrize("v", [32, 64])
def test_sglang_fp8_tile_rule(v):
    """The proposal's rule, one scale amax / 240 per (head, 32-row V tile x K), E4M3 codes of x / scale, at one
    and at two tiles per head. GDN states are [HV, V, K] in the formats' layout."""
    x = _state((2, v, 16), 2, [0.0, -0.0, 1e-40, 448.0, -1e-3]) * torch.linspace(0.01, 1, v).view(1, v, 1)
    tiles = x.view(2, v // 32, 32, 16)
    scale = tiles.abs().amax(dim=(2, 3), keepdim=True) / 240  # FP32, correctly rounded
    want = ((tiles / scale).to(torch.float8_e4m3fn).float() * scale).view(x.shape)
    got = _preset_format("sglang:fp8").quantize(x)
    assert torch.equal(got, want)


def modelopt_int8_codec(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ModelOpt's int8_hadamard32 state codec on the rotated key-first state [H, K, V] (per key channel and 32
    values): scale = max(amax / 127, 6e-8) in FP32, code = round-half-away(x / scale) in [-127, 127], and the
    value reconstructed with the scale rounded to FP16."""
    h, k, v = y.shape
    groups = y.reshape(h, k, v // 32, 32)
    with np.errstate(all="ignore"):
        scale = np.maximum(np.abs(groups).max(-1, keepdims=True) / np.float32(127), np.float32(6e-8))
        q = groups / scale
        codes = np.clip(np.sign(q) * np.floor(np.abs(q) + np.float32(0.5)), -127, 127)
        return codes.reshape(y.shape), (codes * scale.astype(np.float16).astype(np.float32)).reshape(y.shape)


def test_modelopt_codec_agrees_but_for_ties_floor_and_fp16_scales():
    fmt = _preset_format("modelopt:int8-hadamard")  # Rotated(int8:axis=headdim,scale=block:32), 32-point Hadamard
    x = _state((2, 64, 8), 3, [0.0, -0.0, 1e-40])  # formats' layout [HV, V, K]
    y = fmt.rotate(x)  # the rotated state in our FP64-then-FP32 arithmetic
    packed = fmt.inner.encode(y)
    codes, deq = modelopt_int8_codec(y.transpose(-1, -2).numpy())  # key-first [H, K, V]
    assert torch.equal(packed.data.float(), torch.from_numpy(codes).transpose(-1, -2))
    ours = fmt.inner.decode(packed)
    assert not torch.equal(ours, torch.from_numpy(deq).transpose(-1, -2))  # FP16 scales move the values
    tie = torch.zeros(1, 32, 1)
    tie[0, :3, 0] = torch.tensor([127.0, 2.5, -0.5])  # scale 1: 2.5 and -0.5 are ties
    assert fmt.inner.encode(tie).data[0, :3, 0].tolist() == [127, 2, 0]
    assert modelopt_int8_codec(tie.transpose(-1, -2).numpy())[0][0, 0, :3].tolist() == [127, 3, -1]

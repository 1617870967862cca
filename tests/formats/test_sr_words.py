"""The word layouts of the stochastic formats (`words=`) and fp16sr's software conversion (`cvt=soft`) in the Triton
kernels, bit for bit.

Each variant's kernel codec (`KernelCodec.words`, kind FP16SR_SOFT) must make `quantize_triton` (Philox from a seed,
or given words), `encode_triton` (the keyed words of a stored copy) and the in-tile rounding of the chunked kernels
(`device.state_bits` in `round_tile`) equal the torch format, on rows of odd length (a last unpaired element, a
last partial Philox group), counters that cross a 32-bit boundary, and the values where the roundings differ: FP16
subnormals and FP32 subnormals, exact FP16 values and midpoints, signed zeros, the overflow edge, +-Inf and NaN.
fp16sr has the engines' pairs and groups; the scaled and MX8 stochastic formats one call per element, 2 or 4
(`SCALED`: their codes as `tests/formats/test_encode_triton.py` checks them, with these words).
"""

import pytest
import torch

from replayssm_eval.formats import get_format
from replayssm_eval.formats.codec import Kind, Words
from replayssm_eval.formats.packed import PackedState
from replayssm_eval.formats.triton import encode_triton, quantize_triton
from replayssm_eval.replay.keys import state_random_bits

from tests.helpers.kernel_checks import round_tile_in_kernel

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # the interpreter reports 1/0 in numpy

VARIANTS = ["fp16sr:words=pair", "fp16sr:words=duo", "fp16sr:words=quad", "fp16sr:words=octet", "fp16sr:cvt=soft",
            "fp16sr:words=pair,cvt=soft", "fp16sr:words=duo,cvt=soft", "fp16sr:words=quad,cvt=soft",
            "fp16sr:words=octet,cvt=soft", "fp16sr:words=quad,rounds=7,bits=9"]
SCALED = ["int16sr:words=quad", "fp8sr:scale=head,words=duo", "int8sr:scale=block:8,words=quad", "mx8sr:words=quad",
          "int8sr:axis=headdim,bits=24,words=duo", "fp8sr:scale=rowcol,bits=8,words=quad"]
SPECIAL = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65504.0, -65519.0, 65520.0, 1e30, 2.0**-14,
           -(2.0**-14) * (1 - 2.0**-11), 2.0**-24, 3 * 2.0**-25, -(2.0**-20) * 1.37, 1e-40, -1e-39, 1.0 + 2.0**-11,
           -(1.0 + 3 * 2.0**-11), 2049.0, 2.0**15 * (1 + 2.0**-10)]


def awkward_states(shape, seed=0) -> torch.Tensor:
    """`[B, H, P, N]` FP32 states of every magnitude from FP32 subnormals to past 65504, the SPECIAL values spread
    over them (odd positions included; as many as fit)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 17, shape, generator=g).float())
    flat = x.view(-1)
    where = torch.randperm(flat.numel(), generator=g)[: 3 * len(SPECIAL)]
    flat[where] = torch.tensor(SPECIAL * 3)[: where.numel()]
    return x


def _words(spec: str) -> Words:
    return Words[(spec.partition("words=")[2].partition(",")[0] or "element").upper()]


def test_codecs_cover_every_variant():
    """Every words= and cvt= has a codec, with any rounds= and bits=; cvt=soft is its own element kind. The scaled and
    MX8 stochastic formats take one word an element, or one Philox call per 2 or 4 (their pairs are fp16sr's)."""
    for spec in VARIANTS:
        codec = get_format(spec).kernel_codec
        assert codec.kind == (Kind.FP16SR_SOFT if "soft" in spec else Kind.FP16SR) and codec.stochastic
        assert codec.words == _words(spec)
        assert codec.packed and codec.data_dtype == torch.float16
    assert get_format("fp16sr:words=pair,rounds=7").kernel_codec.random == (int(Words.PAIR), 7, 13)
    for spec in SCALED:
        fmt = get_format(spec)
        assert fmt.kernel_codec.words == _words(spec) and fmt.name == spec
        assert len(fmt.lane_words) == {Words.DUO: 2, Words.QUAD: 4}[_words(spec)]
    assert get_format("int16sr:words=element").lane_words is None
    for spec in ("int16sr:words=pair", "mx8sr:words=octet", "fp8:words=quad"):
        with pytest.raises(ValueError, match="words"):
            get_format(spec)


@pytest.mark.parametrize("spec", VARIANTS + SCALED)
@pytest.mark.parametrize("shape, offset", [((2, 3, 5, 37), 2**32 - 301), ((1, 2, 4, 1), 0), ((3, 1, 3, 13), 2**40 + 3)])
def test_quantize_triton_seeded(spec, shape, offset, device, bits_equal):
    """Philox from a seed (the engines' own layouts: one tl.randint4x per group, lanes, pairs) == fmt.quantize."""
    fmt = get_format(spec)
    x = awkward_states(shape)
    bits_equal(quantize_triton(x.to(device), fmt, seed=2**33 + 9, offset=offset).cpu(),
               fmt.quantize(x, seed=2**33 + 9, offset=offset))


@pytest.mark.parametrize("spec", VARIANTS + SCALED)
def test_quantize_triton_given_words(spec, device, bits_equal):
    """One word per element given (random_bits): pairs read 2j's word, the other layouts each element's own."""
    fmt = get_format(spec)
    x = awkward_states((2, 2, 3, 21), seed=1)
    words = torch.randint(0, 2**32, x.shape, generator=torch.Generator().manual_seed(2), dtype=torch.int64)
    bits_equal(quantize_triton(x.to(device), fmt, random_bits=words.to(device)).cpu(),
               fmt.quantize(x, random_bits=words))


@pytest.mark.parametrize("spec", VARIANTS)
def test_encode_triton_keyed(spec, device, bits_equal):
    """The packed checkpoint of a stored copy (keyed words of `replay.keys`) == fmt.encode, FP16 code for code (NaN
    payloads free: a GPU stores 0x7FFF where torch stores 0x7E00); in place for some states only (`take`, with the
    decoded copy)."""
    fmt = get_format(spec)
    x = awkward_states((3, 2, 5, 19), seed=3)
    keys, checkpoint = torch.tensor([11, -(2**62) + 5, 7]), torch.tensor([0, 5, 2**20])
    ref = fmt.encode(x, random_bits=state_random_bits(keys, checkpoint, tuple(x.shape[1:]), fmt.lane_words))
    got = encode_triton(x.to(device), fmt, keys.to(device), checkpoint.to(device))
    assert got.format == ref.format
    bits_equal(got.data.cpu(), ref.data)
    take = torch.tensor([False, True, True])
    out = PackedState(fmt.name, tuple(x.shape), torch.zeros(x.shape, dtype=torch.float16, device=device))
    decoded = torch.zeros(x.shape, device=device)
    encode_triton(x.to(device), fmt, keys.to(device), checkpoint.to(device), take=take.to(device), out=out,
                  decoded=decoded)
    bits_equal(out.data.cpu()[take], ref.data[take])
    assert torch.equal(out.data.cpu()[0], torch.zeros_like(ref.data[0]))
    assert torch.equal(decoded.cpu()[take].nan_to_num(7.0), fmt.decode(ref)[take].nan_to_num(7.0))


@pytest.mark.parametrize("spec", ["fp16sr", "fp16sr:words=pair", "fp16sr:words=duo", "fp16sr:words=quad",
                                  "fp16sr:words=octet,cvt=soft", *SCALED])
def test_keyed_words_are_the_seeded_draws(spec):
    """A stored copy's keyed words follow the format's word layout (`fmt.lane_words`): encoding with them is
    `fmt.encode(x, seed=key, offset=checkpoint << 32)`, sequence by sequence (one Philox call per group of a row)."""
    fmt = get_format(spec)
    x = awkward_states((3, 2, 5, 19), seed=5)
    keys, checkpoint = torch.tensor([11, -(2**62) + 5, 7]), torch.tensor([0, 5, 2**20])
    keyed = fmt.encode(x, random_bits=state_random_bits(keys, checkpoint, tuple(x.shape[1:]), fmt.lane_words))
    for b in range(3):
        seeded = fmt.encode(x[b:b + 1], seed=int(keys[b]), offset=int(checkpoint[b]) << 32)
        assert torch.equal(keyed.data[b:b + 1].view(torch.uint8), seeded.data.view(torch.uint8)), (spec, b)


@pytest.mark.parametrize("spec", ["fp16sr:words=pair", "fp16sr:words=octet,cvt=soft", "fp16sr:words=quad,cvt=soft",
                                  "int16sr:words=quad", "mx8sr:words=quad", "int8sr:scale=block:8,words=duo"])
def test_in_tile_rounding(spec, device, bits_equal):
    """`state_bits` + `round_tile` in a kernel's tile with rows of odd length == the keyed torch rounding."""
    fmt = get_format(spec)
    x = awkward_states((2, 1, 6, 23), seed=4)  # [B, 1, P, N]
    keys, checkpoint = torch.tensor([3, 2**50 + 1]), torch.tensor([1, 2**31 - 1])
    y = round_tile_in_kernel(x.to(device), fmt.kernel_codec, keys, checkpoint)
    bits_equal(y.cpu(), fmt.quantize(x, random_bits=state_random_bits(keys, checkpoint, tuple(x.shape[1:]), fmt.lane_words)))

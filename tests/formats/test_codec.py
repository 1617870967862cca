"""Each format's kernel codec against the torch rounding, and a new format added as its class plus its codec.

Every format with a `kernel_codec` is rounded by the Triton device codecs exactly as its torch `quantize` / `encode`
(interpreter on CPU): through `quantize_triton` (given words, and Philox from a seed with the format's `rounds=`),
`encode_triton` and the in-tile rounding of the chunked kernels (`device.round_tile` with the Philox words of
`replay.keys`), SR `bits=` from 3 to 32 included. A toy format (BF16 codes times an FP32 scale per row,
`scale = amax / 256`) is registered with only its class and its codec, and runs through the references and the
conformance check of the Triton decode steps.
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from replayssm_eval.formats import get_format, list_formats, registry, rounding
from replayssm_eval.formats.codec import Group, KernelCodec, Kind, Order, Words, packed_codec, tile_codec
from replayssm_eval.formats.formats import ScaledFormat
from replayssm_eval.formats.rotation import hadamard_runs
from replayssm_eval.formats.triton import encode_triton, quantize_triton
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.keys import state_random_bits
from replayssm_eval.regress import conformance, golden

from tests.helpers.kernel_checks import round_tile_in_kernel

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # the interpreter reports 1/0 in numpy

# every registered format, plus the options that change its codec
SPECS = list_formats() + ["fp8:scale=head", "fp8sr:scale=tensor,max=240", "fp8e5m2:scale=none", "nvfp4:scale=row",
                          "nvfp4:scale=tensor", "nvfp4:axis=headdim", "mxfp4:axis=headdim", "fp16sr:bits=8",
                          "fp8:axis=headdim", "nvfp4:scale=rowcol", "fp16:rot=hadamard:8", "int16:scale=head",
                          "int8sr:scale=tensor", "int8:order=mul", "int16sr:scale=head,order=mul",
                          "fp8:scale=head,order=mul", "fp16sr:words=pair", "fp16sr:words=octet,cvt=soft",
                          "int8:scale=block:16", "fp8sr:scale=block:8,order=mul", "int16:scale=tile:4x8",
                          "fp8:scale=tile:32x0,max=240", "int8:scale=tile:3x5,order=mul", "int8sr:scale=tile:0x16",
                          "int8sr:axis=headdim,scale=block:4", "fp8:axis=headdim,scale=head,order=mul",
                          "int16:axis=headdim,scale=tile:8x2", "int8:rot=hadamard:8", "nvfp4:scale=row,rot=hadamard:4",
                          "fp16sr:words=pair,rot=hadamard:2", "int8:scale=rowcol,rot=hadamard:8",
                          "int8sr:scale=head,rot=hadamard:1",
                          # SR with non-default rounds= and bits= (down to 3, up to the most each format accepts)
                          "fp16sr:rounds=7,bits=8", "fp16sr:words=octet,cvt=soft,rounds=7,bits=5",
                          "fp16sr:words=pair,bits=3", "fp8sr:bits=20", "fp8sr:scale=head,rounds=7,bits=3",
                          "int8sr:bits=32", "int16sr:scale=block:8,rounds=7,bits=24", "mx8sr:rounds=7,bits=32",
                          "mx8sr:axis=headdim,bits=3"]


@dataclass(frozen=True)
class ToyFormat(ScaledFormat):
    """toybf16: BF16 codes of x / s, s = amax / 256 over the scale group (`ScaledFormat`); data: bfloat16."""

    base: str = "toybf16"
    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {"axis": ("dstate",), "scale": ("row", "head", "tensor", "none")}

    @property
    def max_value(self) -> float:
        return 256.0

    @property
    def code_bytes(self) -> int:
        return 2

    def _round(self, v, words):
        return rounding.round_bf16(v)

    def _to_codes(self, q):
        return q.to(torch.bfloat16)

    def _from_codes(self, data):
        return data.float()

    @property
    def kernel_codec(self) -> KernelCodec:
        return KernelCodec(Kind.BF16, Group[self.scale.upper()], self.max_value)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(registry.FORMATS, "toybf16", ToyFormat)
    return "toybf16"


def _states(shape=(3, 2, 5, 40), seed=0) -> torch.Tensor:
    """[B, H, P, N] states with rows of mixed magnitude, a zero row and a zero head."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-12, 12, shape[:-1], generator=g).float())[..., None]
    x[0, 1, 2] = 0.0
    x[1, 0] = 0.0
    return x


def _check_codec(fmt, device_name, bits_equal, states=None):
    """fmt's codec rounds as its torch reference on states [3, H, P, N] (`_states` without): quantize_triton,
    encode_triton and the in-tile rounding."""
    codec = fmt.kernel_codec
    x = _states() if states is None else states
    keys, checkpoint = torch.tensor([11, 2**40 + 3, 7]), torch.tensor([0, 5, 2**20])
    words = state_random_bits(keys, checkpoint, tuple(x.shape[1:]), fmt.lane_words)  # [B, H, P, N] `replay.keys` words
    bits = {"random_bits": words} if fmt.is_stochastic else {}
    want = fmt.quantize(x, **bits)
    if codec.group == Group.DUAL:  # whole-head factors: only the in-tile rounding
        with pytest.raises(NotImplementedError, match="whole head"):
            quantize_triton(x.to(device_name), fmt)
    else:
        bits_equal(quantize_triton(x.to(device_name), fmt, **bits).cpu(), want)
    if fmt.is_stochastic:  # Philox-`rounds=` words from a seed, counters past 2^32
        seeded = {"seed": 2**35 + 17, "offset": 2**32 - 77}
        bits_equal(quantize_triton(x.to(device_name), fmt, **seeded).cpu(), fmt.quantize(x, **seeded))
    if codec.packed:
        got = encode_triton(x.to(device_name), fmt, keys.to(device_name), checkpoint.to(device_name))
        ref = fmt.encode(x, **bits)
        assert got.format == ref.format and got.data.dtype == codec.data_dtype == ref.data.dtype
        for name in got.FIELDS:
            a, b = getattr(got, name), getattr(ref, name)
            assert (a is None) == (b is None), name
            if a is not None:
                assert torch.equal(a.cpu().view(torch.uint8), b.view(torch.uint8)), name
    tiled = tile_codec(fmt, dims=tuple(x.shape[-2:]))
    if tiled is not None:  # one program per state of one head, as the chunked kernels with head scales
        xs = x[:, :1].contiguous()  # [B, 1, P, N]
        tile_bits = {"random_bits": words[:, :1]} if fmt.is_stochastic else {}
        got = round_tile_in_kernel(xs.to(device_name), tiled, keys, checkpoint).cpu()
        bits_equal(got, fmt.quantize(xs, **tile_bits))


@pytest.mark.parametrize("spec", SPECS)
def test_codec_rounds_as_torch(spec, device, bits_equal):
    fmt = get_format(spec)
    if fmt.kernel_codec is None:
        with pytest.raises(NotImplementedError, match="kernel_codec"):
            quantize_triton(torch.zeros(1, 2, 16), fmt)
        return
    _check_codec(fmt, device, bits_equal)


def _mx8_states(shape) -> torch.Tensor:
    """[B, H, P, N] states (N = 40: blocks of 16 padded) holding MX8's awkward cases along d_state in head 0."""
    x = _states(shape)
    step = 2.0 ** -5  # the step of a pair reaching the block's exponent E = 0
    x[0, 0, 0, :16] = torch.tensor([1.5, 21.5 * step, -1.0, -7.5 * step, 40.5 * step / 2, 0.0, 63.75 * step, -0.0,
                                    2.0 ** -130, 1.0, 0.5 * step, 1.0, -0.5 * step, -1.0, 2.0 ** -7, 1.25 * 2 ** -7])
    x[0, 0, 1, :16] = torch.randn(16) * 2.0 ** -130  # a block of subnormals (E = -126, mu = 1: steps of 2^-132)
    x[0, 0, 1, 16:32] = torch.tensor([2.0 ** -126, 3 * 2.0 ** -133, 2.0 ** -149, -(2.0 ** -127)] * 4)
    x[0, 0, 2, 16:32] = torch.randn(16) * 2.0 ** 126  # huge, up to the largest FP32
    x[0, 0, 2, 20] = torch.finfo(torch.float32).max
    x[0, 0, 3, 5] = float("inf")
    x[0, 0, 3, 33] = -float("inf")  # in the padded last block
    x[0, 0, 4, 20] = float("nan")
    x[0, 0, 2, :16] = 0.0
    return x


@pytest.mark.parametrize("spec", ["mx8", "mx8sr", "mx8sr:axis=headdim"])
def test_mx8_codec_awkward_values(spec, device, bits_equal):
    """MX8's device codec (`device.mx8_tile`) == the torch format on zeros, -0, subnormals (E floor -126), huge values,
    ties at m + 1/2 (away from zero), the clamp at 63, pairs with one zero, blocks with Inf / NaN and a blocked axis
    of 40, through quantize_triton and the in-tile rounding, bit for bit."""
    fmt = get_format(spec)
    x = _mx8_states((3, 2, 5, 40))
    if fmt.axis == "headdim":
        x = _mx8_states((3, 2, 24, 40)).transpose(-1, -2).contiguous()  # [3, 2, 40, 24]: the cases along head_dim
    _check_codec(fmt, device, bits_equal, x)
    if not fmt.is_stochastic:  # the torch reference's own hand-computed values: a tie, the clamp, a subnormal block
        y = fmt.quantize(x)[0, 0]
        assert y[0, 1] == 22 * 2.0 ** -5 and y[0, 3] == -8 * 2.0 ** -5 and y[0, 6] == 63 * 2.0 ** -5
        assert y[0, 4] == 41 * 2.0 ** -6 and y[0, 10] == 2.0 ** -5 and y[0, 12] == -(2.0 ** -5)
        assert y[0, 14] == 2.0 ** -6 and y[0, 8] == 0.0 and y[0, 7] == 0.0 and not y[0, 7].signbit()
        assert torch.isnan(y[3, :16]).all() and not torch.isnan(y[3, 16:32]).any() and torch.isnan(y[4, 16:32]).all()


def _rowcol_states(codec, shape=(3, 2, 24, 40)) -> torch.Tensor:
    """[B, H, P, N] states for scale=rowcol, built in the codec's oriented view [B, H, R, C] (transposed along
    head_dim): `_states` plus, in head 0 of state 0, a zero column, a column of subnormals (a subnormal column
    factor), -0.0 and subnormals beside normal values; in head 1 of state 1, column factors that are powers of two
    (the head's first row) and rows that divide to midpoints of the element grid (`golden`'s ties; none for NVFP4's
    blocks) times 2^-e, with amax codec.max * 2^-e < 1 (an exact power-of-two row scale); a NaN in head 0 and an Inf
    in head 1 of state 2."""
    xo = _states(shape)
    xo[0, 0, :, 3] = 0.0
    xo[0, 0, :, 5] = torch.randn(shape[2]) * 1e-40
    xo[0, 0, 2, 7], xo[0, 0, 4, 8], xo[0, 0, 6, 9] = -0.0, 1e-42, -(2.0 ** -130)
    xo[2, 0, 3, 11], xo[2, 1, 5, 13] = float("nan"), float("inf")  # a NaN column factor; an Inf one (Inf / Inf = NaN)
    if codec.kind != Kind.NVFP4:
        ties = golden.INT_TIES if "INT" in codec.kind.name else golden.FP_TIES
        step = 2.0 ** -math.ceil(math.log2(codec.max + 1))  # 2^-e: the row scale
        y = torch.tensor(ties)[torch.arange((shape[2] - 1) * shape[3]) % len(ties)].view(shape[2] - 1, shape[3])
        y[:, ::2] *= -1.0
        y[:, 0] = codec.max
        col = 2.0 ** (torch.arange(shape[3]) % 7 - 3.0)  # [C] the column factors
        xo[1, 1, 0] = col
        xo[1, 1, 1:] = y * step * col
    return xo.transpose(-1, -2).contiguous() if codec.axis == "headdim" else xo


@pytest.mark.parametrize("spec", ["fp8:scale=rowcol", "fp8sr:scale=rowcol", "fp8e5m2:scale=rowcol,order=mul",
                                  "fp8:axis=headdim,scale=rowcol,max=240", "int8:scale=rowcol",
                                  "int8sr:axis=headdim,scale=rowcol", "int16:scale=rowcol,order=mul",
                                  "int16sr:scale=rowcol,order=mul", "nvfp4:scale=rowcol",
                                  "nvfp4:axis=headdim,scale=rowcol"])
def test_rowcol_codec_awkward_values(spec, device, bits_equal):
    """scale=rowcol's codec (`Group.ROWCOL`: column factors, x / c, row scales, (q * s) * c in the kernel) == the torch
    format on zero columns, subnormal column factors and elements, -0.0, NaN and Inf, and ties of the element grid,
    along either axis, through quantize_triton and the in-tile rounding, bit for bit; never packed."""
    fmt = get_format(spec)
    codec = fmt.kernel_codec
    assert codec.group == Group.ROWCOL and not codec.packed and packed_codec(fmt) is None
    x = _rowcol_states(codec)
    _check_codec(fmt, device, bits_equal, x)
    if codec.kind in (Kind.FP8, Kind.INT8):  # the ties head: v = y / 2^-e exactly, rounded to even, times 2^-e, times c
        orient = (lambda t: t.transpose(-1, -2)) if codec.axis == "headdim" else (lambda t: t)
        xo, got = orient(x[1, 1]), orient(fmt.quantize(x)[1, 1])  # [R, C]
        step = 2.0 ** -math.ceil(math.log2(codec.max + 1))
        v = (xo[1:] / xo[0]) / step
        q = torch.round(v) if codec.kind == Kind.INT8 else rounding.round_e4m3(v)
        assert not torch.equal(q, v) and torch.equal(got[1:], (q * step) * xo[0])


def _dual_axis_states(axis: str, shape=(5, 2, 24, 40)) -> torch.Tensor:
    """[B, H, P, N] states for `dualaxis`, built in the oriented view [B, H, R, C] (transposed along head_dim), head 0
    of each state awkward: state 0 a zero row, a zero column, -0.0, subnormals and a row whose factor falls below
    2^-14 beside normal rows; state 1 values near 1e10 (factors clamped at 65504, codes saturating); state 2 values
    near 1e-12 (every factor clamped at 2^-14, codes of zero); state 3 all zero; state 4 a NaN and an Inf in head 0,
    none in head 1."""
    xo = _states(shape)
    xo[0, 0, 1] = 0.0
    xo[0, 0, :, 7] = 0.0
    xo[0, 0, 2, 3], xo[0, 0, 4, 9], xo[0, 0, 5, 11] = -0.0, 1e-42, -(2.0 ** -130)
    xo[0, 0, 6] = torch.randn(shape[3]) * 1e-10
    xo[1, 0] = torch.randn(shape[2:]) * 1e10
    xo[2, 0] = torch.randn(shape[2:]) * 1e-12
    xo[3, 0] = 0.0
    xo[4, 0, 3, 5], xo[4, 0, 6, 1] = float("nan"), float("inf")
    return xo.transpose(-1, -2).contiguous() if axis == "headdim" else xo


@pytest.mark.parametrize("spec", ["dualaxis", "dualaxis:width=3", "dualaxis:width=8", "dualaxis:axis=dstate",
                                  "dualaxis:axis=dstate,width=7", "dualaxis:rot=hadamard:8",
                                  "dualaxis:axis=dstate,width=4,rot=hadamard:4"])
def test_dual_axis_codec_awkward_values(spec, device, bits_equal):
    """STEPQuant's dual-axis codes in the kernels' whole-head tile (`device.dual_axis_tile`: FP64 means, sums and
    quotients, FP16 factors clamped to [2^-14, 65504]) == the torch format on zero rows and columns, -0.0, subnormals,
    clamped factors, saturated codes, an all-zero head and heads holding NaN or Inf, C = 24 or 40 (not a power of two),
    along either axis, rotated or not, bit for bit; quantize_triton refuses it (only whole-head programs round it)."""
    fmt = get_format(spec)
    x = _dual_axis_states(fmt.axis)
    _check_codec(fmt, device, bits_equal, x)
    y = fmt.quantize(x)
    assert torch.isnan(y[4, 0]).all() and not torch.isnan(y[4, 1]).any()
    assert not y[3, 0].any() and not y[2, 0].any()  # all zero; every |x| / 2^-28 rounds to a zero code


@pytest.mark.parametrize("spec", ["int8", "fp8:scale=head", "nvfp4", "nvfp4:scale=row", "int16sr:axis=headdim",
                                  "fp8:scale=head,order=mul"])
def test_in_tile_rounding_of_non_finite_groups(spec, device, bits_equal):
    """The in-tile rounding of a row or head scale holding NaN or Inf == the torch format (a NaN amax makes the group
    NaN under order=div, which skips it under order=mul): `device.tile_amax` propagates NaN by comparisons."""
    fmt = get_format(spec)
    x = _states((3, 2, 6, 20))  # [B, H, P, N]
    x[0, 0, 2, 5], x[1, 1, 3, 7], x[2, 0, 4, 1] = float("nan"), float("inf"), -float("inf")
    keys, checkpoint = torch.tensor([11, 2**40 + 3, 7]), torch.tensor([0, 5, 2**20])
    words = state_random_bits(keys, checkpoint, (1, 6, 20), fmt.lane_words)  # [B, 1, P, N]
    for head in (0, 1):
        xs = x[:, head:head + 1].contiguous()  # [B, 1, P, N]: one program per state of one head
        bits = {"random_bits": words} if fmt.is_stochastic else {}
        want = fmt.quantize(xs, **bits)
        bits_equal(round_tile_in_kernel(xs.to(device), fmt.kernel_codec, keys, checkpoint).cpu(), want)


def test_capabilities():
    """What the kernels do with each format is read from its codec alone."""
    codec = get_format("nvfp4:scale=head").kernel_codec
    assert codec.packed and codec.in_tile(whole_head=True) and not codec.in_tile(whole_head=False)
    assert codec.padded(40) == 48 and codec.args == (int(Kind.NVFP4), int(Group.HEAD), 1.0, int(Order.DIV))
    assert not get_format("fp8:scale=tensor").kernel_codec.in_tile(whole_head=True)
    assert not get_format("mxfp8").kernel_codec.packed and get_format("nvfp4:axis=headdim").kernel_codec.axis == "headdim"
    assert get_format("fp8sr:max=240").kernel_codec == KernelCodec(Kind.FP8SR, Group.ROW, 240.0)
    assert get_format("int16sr:scale=head").kernel_codec == KernelCodec(Kind.INT16SR, Group.HEAD, 32767.0)
    assert get_format("int16:order=mul").kernel_codec.args == (int(Kind.INT16), int(Group.ROW), 32767.0, int(Order.MUL))
    assert get_format("int8").kernel_codec.data_dtype == torch.int8 and get_format("int8sr").kernel_codec.stochastic
    # two-axis scales: rounded where a program holds the whole head (column factors span it on either axis), not packed
    for spec in ("int8:scale=rowcol,rot=hadamard:8", "nvfp4:scale=rowcol", "fp8sr:axis=headdim,scale=rowcol,bits=8"):
        rowcol = get_format(spec).kernel_codec
        assert rowcol.group == Group.ROWCOL and rowcol.head_span == 0 and packed_codec(get_format(spec)) is None
        assert rowcol.in_tile(whole_head=True) and not rowcol.in_tile(whole_head=False) and rowcol.spans(128)
    assert get_format("int16:scale=rowcol,order=mul").kernel_codec == KernelCodec(Kind.INT16, Group.ROWCOL, 32767.0,
                                                                                   order=Order.MUL)
    # dual-axis factors: the whole head, its C from the state's dims (none given: torch rounds), never packed
    dual = get_format("dualaxis:width=5")
    assert dual.kernel_codec == KernelCodec(Kind.INT8, Group.DUAL, 15.0, axis="headdim")
    assert not dual.kernel_codec.packed and tile_codec(dual) is None and not dual.kernel_codec.in_tile(whole_head=True)
    assert tile_codec(dual, dims=(80, 128)).cols == 80
    assert tile_codec(get_format("dualaxis:axis=dstate"), dims=(80, 128)).cols == 128
    sized = tile_codec(dual, True, (40, 24))  # C = 40, not a power of two: still in the tile
    assert sized.head_span == 0 and sized.in_tile(whole_head=True) and tile_codec(dual, False, (40, 24)) is None
    # SR rounds= and bits=: the codec's, the kinds' defaults filled in (so default formats compare as before)
    assert get_format("fp16sr:rounds=7,bits=8").kernel_codec == KernelCodec(Kind.FP16SR, rounds=7, bits=8)
    assert get_format("fp16sr:rounds=7,bits=8").kernel_codec.random == (int(Words.ELEMENT), 7, 8)
    int16sr = get_format("int16sr:scale=head,bits=8").kernel_codec
    assert int16sr == KernelCodec(Kind.INT16SR, Group.HEAD, 32767.0, bits=8) and int16sr.packed
    assert packed_codec(get_format("fp16sr:rounds=7")).rounds == 7
    assert get_format("mx8sr:bits=6").kernel_codec == KernelCodec(Kind.MX8SR, block=16, bits=6)
    for kind, k in ((Kind.FP16SR, 13), (Kind.FP16SR_SOFT, 13), (Kind.FP8SR, 16), (Kind.INT8SR, 16), (Kind.MX8SR, 8)):
        assert KernelCodec(kind).bits == k and KernelCodec(kind) == KernelCodec(kind, bits=k)
    assert get_format("fp8").kernel_codec.random == (int(Words.ELEMENT), 10, 0)
    with pytest.raises(ValueError, match="bits=4 given to the deterministic kind FP8; accepted: rounds=10 and bits=0"):
        KernelCodec(Kind.FP8, bits=4)
    # scale tiles and MX blocks: rounded in a chunked program's loop, their packed layout written by torch
    block = get_format("int8sr:scale=block:32").kernel_codec
    assert block == KernelCodec(Kind.INT8SR, Group.TILE, 127.0, rows=1, cols=32) and block.tile == (1, 32)
    assert block.in_tile(whole_head=False) and not block.packed and not block.spans(1)
    sglang = ReplayConfig.parse("sglang:fp8").read_format.kernel_codec
    assert sglang.tile == (32, 0) and sglang.spans(16) and not sglang.spans(32) and not sglang.packed
    assert sglang.in_tile(whole_head=True) and not sglang.in_tile(whole_head=False)
    assert not get_format("int8:scale=tile:3x5").kernel_codec.in_tile(whole_head=True)  # not powers of two
    assert get_format("nvfp4:scale=head").kernel_codec.spans(64) and not get_format("fp8").kernel_codec.spans(1)
    mx = get_format("mxfp4").kernel_codec
    assert mx.in_tile(whole_head=False) and not mx.packed
    # blocks along head_dim: a program holds whole blocks of v columns (whole heads for a row or head scale)
    mx_cols = get_format("mxfp4:axis=headdim").kernel_codec
    assert mx_cols.head_span == 32 and mx_cols.in_tile(whole_head=True) and not mx_cols.in_tile(whole_head=False)
    assert get_format("fp8:axis=headdim").kernel_codec.head_span == 0 and not get_format("fp8:axis=headdim").kernel_codec.packed
    assert get_format("int8:axis=headdim,scale=none").kernel_codec.in_tile(whole_head=False)
    # MX8: blocks of 16 rounded in the loop, never packed
    mx8 = get_format("mx8sr").kernel_codec
    assert mx8 == KernelCodec(Kind.MX8SR, block=16) and mx8.stochastic and mx8.in_tile(whole_head=False)
    assert not mx8.packed and get_format("mx8:axis=headdim").kernel_codec.head_span == 16


def test_rotation_capabilities():
    """A rotation is its inner format's codec with `rot`: rounded in-tile where its runs align with the programs' slabs
    and tile the state, never packed; the engine preset `modelopt:int8-hadamard` in full."""
    modelopt = ReplayConfig.parse("modelopt:int8-hadamard").recur_format.kernel_codec
    assert modelopt == KernelCodec(Kind.INT8, Group.TILE, 127.0, axis="headdim", rows=1, cols=32, rot=32)
    assert modelopt.basis == (1, 32) and modelopt.head_span == 32 and not modelopt.packed and not modelopt.natural
    assert modelopt.spans(16) and not modelopt.spans(32) and not modelopt.in_tile(whole_head=False)
    fmt = get_format("int8:axis=headdim,scale=block:32,rot=hadamard:32")
    assert tile_codec(fmt, dims=(128, 128)) == modelopt and tile_codec(fmt, dims=(64, 24)) == modelopt
    assert tile_codec(fmt, dims=(80, 128)) is None  # runs of 32 do not tile head_dim 80: torch raises
    assert tile_codec(fmt, whole_head=False, dims=(256, 128)) is None  # no program holds the runs (V > 128)
    along_k = get_format("bf16:rot=hadamard:8").kernel_codec
    assert along_k == KernelCodec(Kind.BF16, rot=8) and along_k.basis == (0, 8) and along_k.head_span == 1
    assert along_k.in_tile(whole_head=False) and along_k.fits(5, 16) and not along_k.fits(16, 12)
    assert packed_codec(get_format("int8:rot=hadamard:8")) is None and packed_codec(get_format("int8")) is not None
    assert get_format("int8:rot=hadamard:1").kernel_codec.packed  # H_1 is the identity


def _rotation_states(shape=(3, 2, 64, 12)) -> torch.Tensor:
    """[B, H, P, N] states for rotations of up to 32 along either axis: `_states` plus FP32 subnormals, magnitudes whose
    rotation overflows FP32, -0.0, and heads whose rotation by H_4 along head_dim or d_state is exactly half-integers
    with amax 127 (INT8 ties, blocks of 4)."""
    x = _states(shape)
    x[0, 0, :, :4] = torch.randn(shape[2], 4) * 1e-42
    x[0, 0, 3:5] = 3e38  # runs along d_state overflow
    x[0, 0, 8:16, 6] = 3e38  # and along head_dim
    x[2, 1, 7] = -0.0
    g = torch.Generator().manual_seed(5)
    halves = torch.randint(-127, 127, (2, shape[2], shape[3]), generator=g) + 0.5  # [2, P, N]
    halves[..., ::4] = 127.0  # amax 127: the scale is 1 and the rotated values round as they are
    x[1, 0] = hadamard_runs(halves[0].double(), 4).float()  # along d_state: exact, |sums| / 2 of half-integers
    x[1, 1] = hadamard_runs(halves[1].double().T, 4).float().T  # along head_dim
    return x


@pytest.mark.parametrize("spec", ["int8:axis=headdim,scale=block:32,rot=hadamard:32", "fp8sr:axis=headdim,rot=hadamard:16",
                                  "mxfp8:axis=headdim,rot=hadamard:8", "int16sr:scale=head,rot=hadamard:4",
                                  "int8:axis=headdim,scale=block:4,rot=hadamard:4", "int8:scale=block:4,rot=hadamard:4",
                                  "fp16sr:words=pair,rot=hadamard:2"])
def test_rotated_codec_rounds_as_torch(spec, device, bits_equal):
    """Rotations along head_dim (P = 64) and d_state (N = 12) of awkward states (subnormals, overflow to Inf, -0.0,
    ties): quantize_triton and the in-tile rounding (FP64 butterfly in the kernel) == the torch format, bit for bit."""
    _check_codec(get_format(spec), device, bits_equal, states=_rotation_states())


@pytest.mark.parametrize("scale", ["row", "head", "tensor", "none"])
def test_toy_format_codec(toy, scale, device, bits_equal):
    """The toy format's class and codec are all the kernels need: the Triton roundings equal its torch reference."""
    fmt = get_format(f"{toy}:scale={scale}")
    assert fmt.name == toy + ("" if scale == "row" else f":scale={scale}")
    _check_codec(fmt, device, bits_equal)


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f == "kda" else f
                                    for f in conformance.FAMILIES])  # kda: the delta-rule step kernels again
def test_toy_format_conforms(toy, family, device):
    """The toy format as a read copy and as a shared checkpoint: the reference stores its grid, and the Triton decode
    step, which reads its packed encoding through the codec, conforms with the reference."""
    configs = (f"{toy}/fp16sr@{{L}}", f"shared:{toy}:scale=head@{{L}}")
    cases = conformance.grid_cases("quick", (family,), configs)
    for result in conformance.check_kernel(conformance.triton_adapter, cases, device):
        assert result.status == "pass", result.message
    config = ReplayConfig.parse(configs[0].format(L=4))
    inputs, anchor = conformance.make_inputs(family, "small", 0, 6)
    _, state = conformance.reference_decode(family, inputs, anchor, config)
    assert torch.equal(config.read_format.quantize(state.lo), state.lo) and not torch.equal(state.lo, state.hi)

"""The Triton formats against the torch reference at rtol=0, atol=0 (interpreter on CPU)."""

import pytest
import torch
import triton
import triton.language as tl

from replayssm_eval.formats import get_format, rounding
from replayssm_eval.formats import device
from replayssm_eval.formats.triton import quantize_triton

SPECS = ["fp32", "bf16", "fp16", "fp16sr", "fp8", "fp8sr", "fp8e5m2", "nvfp4", "mxfp8", "mxfp4",
         "fp8:scale=tensor", "fp8sr:scale=head", "fp8e5m2:scale=none", "nvfp4:axis=headdim",
         "nvfp4:scale=head", "nvfp4:axis=headdim,scale=row", "mxfp8:axis=headdim", "mxfp4:axis=headdim",
         "int8", "int16:scale=tensor", "int8sr:scale=none", "int16sr:scale=head", "int16:order=mul",
         "int8sr:scale=none,order=mul", "fp8sr:scale=head,order=mul"]
SHAPES = [(2, 3, 5, 40), (3, 7, 33), (70,)]


def _awkward(shape, device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 30, shape, generator=g).float())
    flat = x.view(-1)
    flat[:3] = 0.0
    flat[5] = 2.0**-140  # FP32 subnormal
    flat[7] = 70000.0  # beyond fp16
    return x.to(device)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("spec", SPECS)
def test_quantize_triton_bit_exact(spec, shape, device, bits_equal):
    fmt = get_format(spec)
    x = _awkward(shape, device)
    kw = {"seed": 2**40 + 17, "offset": 2**33 + 5} if fmt.is_stochastic else {}
    bits_equal(quantize_triton(x, fmt, **kw).cpu(), fmt.quantize(x, **kw).cpu())


@pytest.mark.parametrize("spec", ["fp16sr", "fp8sr", "int16sr", "mx8sr", "mx8sr:bits=32", "int8sr:bits=32",
                                  "fp16sr:cvt=soft", "fp8sr:bits=20"])
def test_random_bits_path(spec, device, bits_equal):
    """Given words; the first 64 within 2^24 of 2^32 (so a 32-bit field carries about as often as not, whatever
    bits of the value lie below the kept step), the last 40 pair values on and off the grids (zeros, a subnormal) with
    the extreme words 0, 1, 2^31 and all ones."""
    fmt = get_format(spec)
    x = _awkward((2, 4, 32), "cpu")
    g = torch.Generator().manual_seed(3)
    words = torch.randint(0, 2**32, x.shape, generator=g)
    words.view(-1)[:64] = 2**32 - torch.randint(1, 2**24, (64,), generator=g)
    values = torch.tensor([0.0, -0.0, 1.0, 0.75, -(2.0**-20), 3 * 2.0**-130, 448.0, 1.0 + 2.0**-23])
    x.view(-1)[-40:] = values.repeat_interleave(5)
    words.view(-1)[-40:] = torch.tensor([0, 1, 2**31, 2**32 - 1, 2**31 - 1]).repeat(8)
    x, words = x.to(device), words.to(device)
    bits_equal(quantize_triton(x, fmt, random_bits=words).cpu(), fmt.quantize(x, random_bits=words).cpu())
    with pytest.raises(ValueError, match="seed"):
        quantize_triton(x, fmt)


def test_non_finite_inputs(device, bits_equal):
    x = torch.randn(2, 3, 48)
    x[0, 0, 4], x[0, 2, 9], x[1, 1, 40] = float("nan"), float("inf"), -float("inf")
    for spec in SPECS:
        fmt = get_format(spec)
        kw = {"seed": 1} if fmt.is_stochastic else {}
        bits_equal(quantize_triton(x.to(device), fmt, **kw).cpu(), fmt.quantize(x, **kw))


@triton.jit
def _elementwise_kernel(x_ptr, bits_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0.0)
    bits = tl.load(bits_ptr + i, mask=m, other=0)
    if OP == "sr_fp16":
        y = device.sr_fp16(x, bits)
    elif OP == "sr_e4m3":
        y = device.sr_e4m3(x, bits)
    elif OP == "e4m3_decode":
        y = device.e4m3_decode(bits)
    elif OP == "e5m2_decode":
        y = device.e5m2_decode(bits)
    elif OP == "e2m1_decode":
        y = device.e2m1_decode(bits)
    elif OP == "e4m3_encode":
        y = device.e4m3_encode(x).to(tl.float32)
    elif OP == "round_int8":
        y = device.round_int(x, 127.0)
    elif OP == "round_int16":
        y = device.round_int(x, 32767.0)
    elif OP == "sr_int8":
        y = device.sr_int(x, bits, 127.0)
    elif OP == "sr_int16":
        y = device.sr_int(x, bits, 32767.0)
    else:
        y = device.e2m1_encode(x).to(tl.float32)
    tl.store(out_ptr + i, y, mask=m)


def _run(op, x, bits, device):
    """`op` of x (FP32) and bits (int64) by the kernel on `device`; the result on CPU."""
    x, bits = x.to(device), bits.to(device)
    out = torch.empty_like(x)
    _elementwise_kernel[(triton.cdiv(x.numel(), 1024),)](x, bits, out, x.numel(), OP=op, BLOCK=1024)
    return out.cpu()


def test_device_functions(bits_equal, device):
    codes = torch.arange(256, dtype=torch.int64)
    zeros = torch.zeros(256)
    bits_equal(_run("e4m3_decode", zeros, codes, device), rounding.e4m3_from_bits(codes))
    bits_equal(_run("e5m2_decode", zeros, codes, device), rounding.e5m2_from_bits(codes))
    bits_equal(_run("e2m1_decode", zeros[:16], codes[:16], device), rounding.e2m1_from_bits(codes[:16]))
    grid = rounding.e4m3_from_bits(codes)
    assert torch.equal(_run("e4m3_encode", grid, codes, device).long(), rounding.e4m3_to_bits(grid).long())
    grid4 = rounding.e2m1_from_bits(codes[:16])
    assert torch.equal(_run("e2m1_encode", grid4, codes[:16], device).long(), codes[:16])
    x = torch.randn(4096) * torch.exp2(torch.randint(-28, 18, (4096,)).float())
    words = torch.randint(0, 2**32, (4096,))
    bits_equal(_run("sr_fp16", x, words, device), rounding.sr_fp16(x, words))
    bits_equal(_run("sr_e4m3", x, words, device), rounding.sr_e4m3(x, words))


def test_integer_roundings(bits_equal, device):
    """round_int and sr_int against `rounding`: ties at .5 (to even), saturation, NaN -> 0, +-Inf, no -0 code."""
    halves = torch.arange(-33000, 33000, 1.0) + 0.5  # every tie of the int16 range and beyond it
    special = torch.tensor([0.0, -0.0, -0.25, -0.5, 0.49999997, float("nan"), -float("nan"), float("inf"),
                            -float("inf"), 1e30, -1e30, 2.0**-140, -2.0**-140, 126.99999, -127.5, 32766.99])
    x = torch.cat([halves, special, torch.randn(4096) * torch.exp2(torch.randint(-20, 17, (4096,)).float())])
    words = torch.randint(0, 2**32, x.shape, generator=torch.Generator().manual_seed(5))
    for bits, qmax in ((8, 127), (16, 32767)):
        bits_equal(_run(f"round_int{bits}", x, words, device), rounding.round_int(x, qmax))
        bits_equal(_run(f"sr_int{bits}", x, words, device), rounding.sr_int(x, words, qmax, rounding.INT_SR_BITS))

"""INT8 / INT16 states: golden values, bit-exactness against a numpy formula, SR bias, saturation, zeros."""

import numpy as np
import pytest
import torch

from replayssm_eval.formats import get_format


def _ref(x: np.ndarray, qmax: int, group: str, axis: str, words: np.ndarray | None = None, k: int = 16) -> np.ndarray:
    """Independent numpy formula: s = amax / qmax (FP32), code = RNE or SR of x / s, saturated, times s."""
    x = x.astype(np.float32).reshape(-1, *((1, 1) + x.shape)[-3:])  # [B, H, P, N]
    if axis == "headdim":
        x = x.swapaxes(-1, -2)
        words = None if words is None else words.reshape(x.shape[0], *x.shape[1:2], x.shape[3], x.shape[2]).swapaxes(-1, -2)
    c = x.shape[-1]
    if group.startswith("block:"):
        n = int(group[6:])
        amax = np.zeros(x.shape, np.float32)
        for j in range(0, c, n):
            amax[..., j:j + n] = np.abs(x[..., j:j + n]).max(-1, keepdims=True)
    else:
        dims = {"row": (3,), "head": (2, 3), "tensor": (1, 2, 3)}[group]
        amax = np.broadcast_to(np.abs(x).max(dims, keepdims=True), x.shape)
    s = (amax / np.float32(qmax)).astype(np.float32)
    s = np.where(s == 0, np.float32(1), s)
    v = (x / s).astype(np.float32)
    if words is None:
        code = np.clip(np.rint(v), -qmax, qmax)
    else:
        r = (words.astype(np.int64) & ((1 << k) - 1)).astype(np.float64) / 2.0**k
        code = np.clip(np.sign(v) * np.floor(np.abs(v).astype(np.float64) + r), -qmax, qmax)
    y = ((code + 0.0).astype(np.float32) * s).astype(np.float32)  # two's complement: no -0
    return y.swapaxes(-1, -2) if axis == "headdim" else y


def test_golden_row():
    x = torch.tensor([[[127.0, 63.5, -31.75, 2.5, -2.5, 0.0, 1e-9, 126.49]]])
    p = get_format("int8").encode(x)
    assert p.global_scale.item() == 1.0  # amax / 127
    assert p.data.view(-1).tolist() == [127, 64, -32, 2, -2, 0, 0, 126]  # ties to even
    assert p.data.dtype == torch.int8 and p.global_scale.dtype == torch.float32
    p = get_format("int16").encode(x * 2)
    assert p.global_scale.item() == np.float32(254.0) / np.float32(32767)
    assert p.data.dtype == torch.int16 and p.data.view(-1)[:2].tolist() == [32767, 16384]


@pytest.mark.parametrize("spec", ["int8", "int8:scale=head", "int8:scale=tensor", "int16", "int16:axis=headdim",
                                  "int8:scale=block:5", "int8:axis=headdim,scale=block:3", "int16:scale=block:64"])
@pytest.mark.parametrize("shape", [(2, 3, 7, 33), (5, 17), (1, 1, 1, 1)], ids=str)
def test_matches_numpy(spec, shape, bits_equal):
    fmt = get_format(spec)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape, generator=g))
    ref = _ref(x.numpy(), fmt.qmax, fmt.scale, fmt.axis)
    bits_equal(fmt.quantize(x), torch.from_numpy(np.ascontiguousarray(ref)).reshape(shape))


@pytest.mark.parametrize("spec", ["int8sr", "int16sr:scale=block:4", "int8sr:axis=headdim,scale=head", "int8sr:bits=5"])
def test_sr_matches_numpy(spec, bits_equal):
    fmt = get_format(spec)
    shape = (2, 3, 6, 9)
    x = torch.randn(shape)
    words = torch.randint(0, 2**32, shape, dtype=torch.int64)
    ref = _ref(x.numpy(), fmt.qmax, fmt.scale, fmt.axis, words.numpy(), int(fmt.bits))
    bits_equal(fmt.quantize(x, random_bits=words), torch.from_numpy(np.ascontiguousarray(ref)).reshape(shape))


def test_saturation_zero_and_nonfinite():
    fmt = get_format("int8:scale=block:4")
    x = torch.tensor([[[0.0, -0.0, 0.0, 0.0, -0.0, 1.0, -1.0, 0.5, 1.0, float("inf"), 0.0, 0.0]]])
    p = fmt.encode(x)
    assert p.data.view(-1)[:9].tolist() == [0, 0, 0, 0, 0, 127, -127, 64, 0]
    y = fmt.decode(p).view(-1)
    assert not torch.signbit(y[:5]).any() and y[:5].eq(0).all()  # -0.0 encodes as code 0, decodes as +0.0
    assert p.scales.view(-1)[0].item() == 1.0  # an all-zero group takes s = 1
    assert torch.isnan(y[8:]).all()  # a group holding Inf decodes to NaN throughout
    # a value above the group amax (impossible for its own group) saturates: decode a scale that is too small
    assert get_format("int8:scale=none").encode(torch.tensor([[[300.0, -300.0, 126.5]]])).data.view(-1).tolist() \
        == [127, -127, 126]


def test_sr_saturates_and_zero():
    fmt = get_format("int16sr")
    x = torch.tensor([[[1.0, -1.0, -0.0, 0.0]]])
    all_ones = torch.full(x.shape, 2**32 - 1, dtype=torch.int64)
    p = fmt.encode(x, random_bits=all_ones)
    assert p.data.view(-1).tolist() == [32767, -32767, 0, 0]


def test_sr_bits_bias_is_predictable():
    """Every r of K bits once: E[SR(v)] = floor(v) + floor(2^K frac) / 2^K, exact; K = 16 by default."""
    s_row = torch.tensor([127.0])  # a group member at amax makes s = 1 exactly
    v = torch.tensor([3.3, -7.71, 0.05, 100.5])
    x = torch.cat((s_row, v)).view(1, 1, 5)
    for k in (4, 16):
        fmt = get_format(f"int8sr:bits={k}")
        words = torch.arange(2**k, dtype=torch.int64).view(-1, 1, 1, 1).expand(-1, 1, 1, 5)
        mean = fmt.quantize(x.expand(2**k, 1, 1, 5).contiguous(), random_bits=words.contiguous()).double().mean(0)
        frac = v.double().abs() - v.double().abs().floor()
        expect = torch.sign(v.double()) * (v.double().abs().floor() + torch.floor(frac * 2**k) / 2**k)
        assert torch.allclose(mean.view(-1)[1:], expect, rtol=0, atol=1e-12)
    # 4 bits: bias toward zero of frac - floor(16 frac) / 16, e.g. 0.05 -> 0 (always down)
    assert expect.sub(v.double()).abs().max() < 2**-16


def test_sr_unbiased_over_seeds():
    """Mean of int8sr over 400 Philox seeds is x within 5 standard errors; bits=4 shows its predicted bias."""
    x = torch.cat((torch.tensor([127.0]), torch.full((2047,), 0.05))).view(1, 1, 2048)
    means = {}
    for spec in ("int8sr", "int8sr:bits=4"):
        fmt = get_format(spec)
        total = sum(fmt.quantize(x, seed=seed)[..., 1:].double().mean() for seed in range(400))
        means[spec] = total.item() / 400
    se = (0.05 * 0.95 / (2047 * 400)) ** 0.5
    assert abs(means["int8sr"] - 0.05) < 5 * se
    assert means["int8sr:bits=4"] == 0.0  # floor(16 * 0.05) = 0: never rounds up


def test_rounds_changes_the_bits():
    x = torch.randn(2, 4, 8, 16)
    a = get_format("int8sr").quantize(x, seed=5)
    assert torch.equal(a, get_format("int8sr:rounds=10").quantize(x, seed=5))
    assert not torch.equal(a, get_format("int8sr:rounds=7").quantize(x, seed=5))


def test_error_bands():
    """Relative RMS error on Gaussian rows of 128: RNE int8 about qmax^-1 / sqrt(12) * sqrt(128) / ~2.8."""
    x = torch.randn(4, 8, 32, 128, generator=torch.Generator().manual_seed(0))
    err = {s: ((get_format(s).quantize(x, seed=1) - x).norm() / x.norm()).item()
           for s in ("int8", "int8sr", "int16", "int8:scale=tensor")}
    assert 0.006 < err["int8"] < 0.009 and err["int8"] < err["int8sr"] < 2 * err["int8"]
    assert err["int16"] < err["int8"] / 200
    assert err["int8"] < err["int8:scale=tensor"]

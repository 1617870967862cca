"""Stochastic rounding: every random word enumerated for sampled x; seeds, offsets and special values."""

from fractions import Fraction

import numpy as np
import pytest
import torch

from replayssm_eval.formats import get_format, rounding

# (function, random bits K, grid dtype of the result)
SR = {"fp16": (rounding.sr_fp16, 13, np.float16), "e4m3": (rounding.sr_e4m3, 16, None)}


def _neighbours(x: float, kind: str) -> tuple[float, float]:
    """Grid values bracketing x (down, up), from an independent table of the grid."""
    if kind == "fp16":
        grid = np.arange(2**15, dtype=np.uint16).view(np.float16).astype(np.float64)
    else:
        grid = rounding.e4m3_from_bits(torch.arange(127, dtype=torch.uint8)).double().numpy()
    grid = np.unique(grid[np.isfinite(grid)])
    a = abs(x)
    down = grid[grid <= a].max()
    up = grid[grid >= a].min()
    return (down, up) if x >= 0 else (-down, -up)


def _samples(kind: str, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    lo, hi = (-24, 15) if kind == "fp16" else (-9, 8)
    x = np.sign(rng.standard_normal(24)) * np.exp2(rng.uniform(lo, hi, 24))
    return [float(np.float32(v)) for v in x]


@pytest.mark.parametrize("kind", ["fp16", "e4m3"])
def test_every_random_word(kind):
    fn, k, _ = SR[kind]
    r = torch.arange(2**k, dtype=torch.int64) | (12345 << k)  # bits above K are ignored
    for x in _samples(kind, seed=7):
        y = fn(torch.full((2**k,), x), r).double().numpy()
        down, up = _neighbours(x, kind)
        assert set(np.unique(y)) <= {down, up}
        n_up = int((y == up).sum()) if up != down else 0
        # exact rule: P(up) = floor(2^K * (x - down) / (up - down)) / 2^K
        frac = (Fraction(x) - Fraction(down)) / (Fraction(up) - Fraction(down)) if up != down else Fraction(0)
        assert n_up == int(frac * 2**k), (x, n_up)
        # unbiased whenever x has at most K bits below the kept LSB
        if (frac * 2**k).denominator == 1:
            assert sum(Fraction(v) for v in y) / 2**k == Fraction(x)
        assert y[0] == down  # r = 0 truncates toward zero


@pytest.mark.parametrize("kind", ["fp16", "e4m3"])
def test_on_grid_values_unchanged(kind, bits_equal):
    fn, k, _ = SR[kind]
    if kind == "fp16":
        grid = torch.from_numpy(np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32))
        grid = grid[torch.isfinite(grid)]
    else:
        grid = rounding.e4m3_from_bits(torch.arange(256, dtype=torch.uint8))
        grid = grid[~torch.isnan(grid)]
    for word in (0, 2**k - 1, 0xFFFFFFFF):
        bits_equal(fn(grid, torch.full(grid.shape, word)), grid)


def test_special_values():
    big = torch.tensor([65504.0, 65519.0, 65536.0, 1e30, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-40])
    y = rounding.sr_fp16(big, torch.full(big.shape, 2**13 - 1))
    assert y[0] == 65504 and y[1] == float("inf") and y[2] == y[3] == y[4] == float("inf") and y[5] == -float("inf")
    assert torch.isnan(y[6]) and y[7] == 0 and torch.signbit(y[8])
    assert rounding.sr_fp16(torch.tensor([65519.0]), torch.tensor([0]))[0] == 65504  # truncation stays finite
    # fp16 subnormal results: gradual underflow on the 2^-24 grid
    tiny = torch.full((2**13,), 1.25 * 2.0**-24)
    assert rounding.sr_fp16(tiny, torch.arange(2**13)).double().mean().item() == 1.25 * 2.0**-24
    e = rounding.sr_e4m3(torch.tensor([448.0, 460.0, 1e9, float("inf"), -float("inf"), float("nan")]),
                         torch.full((6,), 2**16 - 1))
    assert e[:4].tolist() == [448.0] * 4 and e[4] == -448 and torch.isnan(e[5])


@pytest.mark.parametrize("spec", ["fp16sr", "fp8sr", "fp8sr:scale=none"])
def test_seed_and_offset(spec):
    fmt = get_format(spec)
    x = torch.randn(2, 3, 8, 40)
    a = fmt.quantize(x, seed=11)
    assert torch.equal(a, fmt.quantize(x, seed=11))
    assert not torch.equal(a, fmt.quantize(x, seed=12))
    # offset shifts the counter: element i with offset 5 draws what element i + 5 draws with offset 0
    flat = x.reshape(-1)
    y0 = fmt.quantize(flat.reshape(1, 1, -1), seed=11)
    y5 = fmt.quantize(flat[5:].reshape(1, 1, -1), seed=11, offset=5)
    if fmt.name == "fp8sr":  # a row scale depends on the row's elements: compare unscaled formats only
        return
    assert torch.equal(y0.reshape(-1)[5:], y5.reshape(-1))


def test_random_bits_replace_philox():
    fmt = get_format("fp16sr")
    x = torch.randn(4, 5, 6)
    from replayssm_eval.formats.philox import randint
    words = randint(9, 100 + torch.arange(x.numel())).reshape(x.shape)
    assert torch.equal(fmt.quantize(x, random_bits=words), fmt.quantize(x, seed=9, offset=100))
    with pytest.raises(ValueError, match="shape"):
        fmt.quantize(x, random_bits=words[:2])


@pytest.mark.parametrize("spec,k,grid_bits", [("fp16sr:bits=4", 4, 10), ("fp8sr:scale=none,bits=3", 3, 3),
                                              ("fp16sr", 13, 10), ("fp8sr:scale=none", 16, 3)])
def test_bits_option_bias_is_predictable(spec, k, grid_bits):
    """Each of the 2^K words once: E[SR(x)] = q * (floor(x/q) + floor(2^K frac) / 2^K) exactly; with few bits that
    misses x by up to q (1 - 2^-K), with the default K (13 / 16) by less than q 2^-K."""
    fmt = get_format(spec)
    x = torch.tensor([1.0 + 0.3 * 2.0**-grid_bits, 1.0 + 0.9 * 2.0**-grid_bits, -(1.0 + 0.05 * 2.0**-grid_bits)])
    words = torch.arange(2**k, dtype=torch.int64).view(-1, 1).expand(-1, 3).contiguous()
    mean = fmt.quantize(x.expand(2**k, 3).contiguous(), random_bits=words).double().mean(0)
    q = 2.0**-grid_bits
    frac = (x.double().abs() - 1.0) / q
    expect = torch.sign(x.double()) * (1.0 + q * torch.floor(frac * 2**k) / 2**k)
    assert torch.allclose(mean, expect, rtol=0, atol=1e-12)
    bias = (mean - x.double()).abs().max().item()
    if k < 6:
        assert bias > 0.04 * q  # 0.05 of a step with 3-4 bits: always truncated
    else:
        assert bias < q * 2.0**-k

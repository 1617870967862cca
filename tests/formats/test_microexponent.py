"""Pimba's state formats (MICRO '25, Section 3.2): MX8 against a per-element reading of the paper, its packing and
random bits, and the INT8 state with one scale per 32 elements as `int8sr:scale=block:32`."""

import math

import numpy as np
import pytest
import torch

from replayssm_eval.formats import get_format
from replayssm_eval.replay.config import ReplayConfig


def _mx8_row(row: list[float], r: list[int] | None, k: int) -> list[float]:
    """One row by the paper's words: 16 values share the exponent of the largest, a pair whose largest is below it
    takes a microexponent of 1, each value keeps a sign and 6 mantissa bits (m <= 63)."""
    pad = -len(row) % 16
    row, r = row + [0.0] * pad, None if r is None else r + [0] * pad
    exps = [math.frexp(abs(v))[1] - 1 if v else None for v in row]
    out = []
    for b in range(0, len(row), 16):
        shared = max([e for e in exps[b:b + 16] if e is not None] + [-126])
        for i in range(b, b + 16):
            pair = [e for e in exps[i - i % 2:i - i % 2 + 2] if e is not None]
            step = 2.0 ** (shared - (0 if pair and max(pair) == shared else 1) - 5)
            frac = 0.5 if r is None else (r[i] % 2 ** k) / 2 ** k
            m = min(math.floor(abs(row[i]) / step + frac), 63)
            out.append(math.copysign(m * step, row[i]) if m else 0.0)
    return out


def _mx8_reference(x: torch.Tensor, words: torch.Tensor | None = None, k: int = 8) -> torch.Tensor:
    rows, n = x.reshape(-1, x.shape[-1]).tolist(), x.shape[-1]
    wrows = [None] * len(rows) if words is None else words.reshape(-1, n).tolist()
    return torch.tensor([_mx8_row(row, w, k)[:n] for row, w in zip(rows, wrows)], dtype=torch.float32).reshape(x.shape)


def _awkward_state(seed: int) -> torch.Tensor:
    """[2, 3, 5, 21]: 21 pads to 32; zeros, an all-zero block, outliers and a tiny value beside a large one."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 5, 21, generator=g) * torch.exp2(torch.randint(-12, 12, (2, 3, 5, 1), generator=g).float())
    x[0, 0, 0, :16] = 0.0  # an all-zero block
    x[0, 1, 2, 3] = 0.0
    x[1, 2, 4, 7] = 3.0e4  # outlier in a block of unit values
    x[1, 0, 1, 0], x[1, 0, 1, 1] = 1.0, 1.0e-30
    return x


def test_mx8_matches_the_papers_rule():
    x = _awkward_state(0)
    assert torch.equal(get_format("mx8").quantize(x), _mx8_reference(x))
    xt = x.transpose(-1, -2)  # axis=headdim blocks along P
    got = get_format("mx8:axis=headdim").quantize(x).transpose(-1, -2)
    assert torch.equal(got, _mx8_reference(xt.contiguous()))


def test_mx8_ties_round_away_from_zero_and_saturate():
    step = 2.0 ** -5  # block max 1.5 -> shared exponent 0, step 2^-5
    x = torch.tensor([1.5, 0.0, 1.0 + 2.5 * step, -(1.0 + 2.5 * step), 63.5 * step, 0.0] + [0.0] * 10)
    y = get_format("mx8").quantize(x.view(1, 1, 16)).flatten()
    assert y[2] == 1.0 + 3 * step and y[3] == -(1.0 + 3 * step)
    assert y[4] == 63 * step  # 63.5 steps rounds to 64, saturates at 63
    assert torch.equal(y, _mx8_reference(x.view(1, 16)).flatten())


def test_mx8_microexponent_halves_the_step_of_a_small_pair():
    x = torch.tensor([1.0, 0.5, 0.3, 0.1] + [0.0] * 12).view(1, 1, 16)
    y = get_format("mx8").quantize(x).flatten()
    assert y[2] == 19 * 2.0 ** -6  # pair (0.3, 0.1) is below 2^0: step 2^-6, not 2^-5 (which gives 10 * 2^-5)
    assert y[1] == 0.5


def test_mx8sr_random_bits_and_unbiased():
    x = _awkward_state(1)
    words = torch.randint(0, 2 ** 32, x.shape, generator=torch.Generator().manual_seed(2), dtype=torch.int64)
    for spec, k in (("mx8sr", 8), ("mx8sr:bits=12", 12)):
        assert torch.equal(get_format(spec).quantize(x, random_bits=words), _mx8_reference(x, words, k)), spec
    v = torch.full((4000, 1, 16), 0.7)
    v[..., 0] = 1.0  # step 2^-5: 0.7 = 22.4 steps
    mean = get_format("mx8sr").quantize(v, seed=5)[..., 1].mean().item()
    assert abs(mean - 0.7) < 4 * 2.0 ** -5 / math.sqrt(4000)


def test_mx8_packing_and_special_blocks():
    x = torch.zeros(1, 2, 20)
    x[0, 0, :3] = torch.tensor([3.0, -0.25, 1.0])
    x[0, 1, 17] = float("nan")
    fmt = get_format("mx8")
    p = fmt.encode(x)
    assert p.data.dtype == torch.uint8 and p.data.shape == (1, 2, 32)
    assert p.nbytes == fmt.storage_bytes(tuple(x.shape)) == 64 and fmt.bits_per_element == 8.0
    block = p.data[0, 0, :16].to(torch.int64)
    field = sum(int(block[2 * j + 1] >> 7) << j for j in range(8))
    assert field == 1 + 127  # e(3.0) = 1
    assert int(block[0] & 0x7F) == 48 and int(block[1] & 0x7F) == 64 | 4 and block[0] >> 7 == 0  # 3 = 48 * 2^-4
    assert [int(b >> 7) for b in block[2::2]] == [1] * 7  # pairs below 2^1 (and zero pairs) take microexponent 1
    y = fmt.decode(p)
    assert torch.equal(y[0, 0], x[0, 0]) and torch.isnan(y[0, 1, 16:]).all() and (y[0, 1, :16] == 0).all()


@pytest.mark.parametrize("spec,message", [
    ("mx8:axis=time", "bad value 'time' for option 'axis' of state format 'mx8'; accepted: dstate, headdim"),
    ("mx8:bits=8", "unknown option 'bits' for state format 'mx8'; accepted: axis, rot, ef"),
    ("mx8sr:bits=40", "bad value '40' for option 'bits' of state format 'mx8sr'; accepted: 1..32"),
])
def test_mx8_bad_options(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_format(spec)


def test_pimba_int8_is_int8sr_with_32_element_scales():
    """Section 3.2: "an 8-bit integer with a scaling factor across every 32 elements", stochastic rounding."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 4, 70, generator=g) * torch.exp2(torch.randint(-12, 12, (2, 3, 4, 1), generator=g).float())
    x[0, 2, 1, 5] = 0.0
    x[1, 1, 3, 32:64] = 0.0  # an all-zero group keeps scale 1
    x[0, 0, 0, 40] = 1.0e4  # outlier in the second group only
    words = torch.randint(0, 2 ** 32, x.shape, generator=g, dtype=torch.int64)
    fmt = ReplayConfig.parse("pimba:int8sr").recur_format
    got = fmt.quantize(x, random_bits=words).numpy()
    xs, r = x.numpy(), (words.numpy() % 2 ** 16).astype(np.float64)
    expected = np.empty_like(xs)
    for c0 in (0, 32, 64):  # groups of 32 along d_state, the last one 6 long
        grp = xs[..., c0:c0 + 32]
        s = np.abs(grp).max(-1, keepdims=True) / np.float32(127)
        s = np.where(s == 0, np.float32(1), s)
        v = (grp / s).astype(np.float64)
        code = np.clip(np.sign(v) * np.floor(np.abs(v) + r[..., c0:c0 + 32] / 2 ** 16), -127, 127)
        expected[..., c0:c0 + 32] = code.astype(np.float32) * s
    np.testing.assert_array_equal(got, expected + 0.0)
    assert fmt.encode(x, seed=1).scales.shape == (2, 3, 4, 3)


def _pimba_port(block: np.ndarray) -> np.ndarray:
    """Our port of the integer steps the Pimba accuracy code (casys-kaist/pimba, src/pimba/accuracy/quants/mx8.py)
    rounds one block of 16 FP32 values with, to nearest: each significand, implicit bit set, is shifted right to
    its pair's reference exponent, rounded to 6 bits (half adds 2^17 below the 18 dropped bits), shifted back
    into the element's own exponent field, a carry past 24 bits raising that exponent, a lost leading bit giving 0."""
    words = block.view(np.uint32).astype(np.int64)
    field = (words >> 23) & 0xFF
    shared = field.max()
    out = np.zeros(16, dtype=np.int64)
    for i in range(16):
        mu = int(field[i - i % 2:i - i % 2 + 2].max() < shared)
        shift = shared - mu - field[i]
        sig = ((words[i] & 0x7FFFFF) | 0x800000) >> shift
        sig = ((sig + (1 << 17)) >> 18 << 18) << shift
        word = (words[i] & ~0x7FFFFF) | (sig & 0x7FFFFF)
        word += (sig & (1 << 24)) >> 1
        out[i] = word if sig >= (1 << 23) else 0
    return out.astype(np.uint32).view(np.float32)


def test_pimba_mx8_agrees_with_a_port_of_the_papers_code_but_past_63_steps():
    g = np.random.default_rng(8)
    x = (g.standard_normal((64, 16)) * np.exp2(g.integers(-20, 20, (64, 1)))).astype(np.float32)
    x[0, 5] = 0.0
    x[1, :2] = 0.0  # an all-zero pair
    x[2] = np.float32(1.5) * np.exp2(np.arange(0, -16, -1)).astype(np.float32)  # values across 16 binades
    x[3, 0], x[3, 1] = np.float32(63.5 / 32), np.float32(-1.0 - 2.5 / 32)  # rounds up to 64 steps; a tie
    ours = ReplayConfig.parse("pimba:mx8").recur_format.quantize(torch.from_numpy(x).view(1, 64, 16)).view(64, 16)
    port = np.stack([_pimba_port(row) for row in x])
    carried = port != ours.numpy()
    # each difference is a magnitude past 63.5 steps: 63 steps here, 64 (the carry into the exponent) there
    assert carried[3, 0] and 0 < carried.sum() < 16
    assert np.array_equal(ours.numpy()[carried], port[carried] * np.float32(63 / 64))
    assert np.all(np.frexp(np.abs(port[carried]))[0] == 0.5)  # 64 steps is a power of two
    assert ours[3, 1] == port[3, 1] == -(1.0 + 3 / 32)  # the tie, away from zero in both

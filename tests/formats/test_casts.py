"""RNE casts and code tables against ml_dtypes (and torch), exhaustively where the space is small."""

import ml_dtypes
import numpy as np
import pytest
import torch

from replayssm_eval.formats import rounding


def _grid_probes(values: np.ndarray) -> np.ndarray:
    """Each finite grid value, the midpoints to its upper neighbour (ties) and the FP32 values either side of them."""
    v = np.sort(np.unique(values[np.isfinite(values)].astype(np.float32)))
    mid = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)  # exact: one more bit than the grid
    probes = [v, mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))]
    return np.concatenate(probes).astype(np.float32)


def _all_patterns(dtype) -> np.ndarray:
    return np.arange(2**16, dtype=np.uint16).view(dtype).astype(np.float32)


@pytest.mark.parametrize("name,dtype,ours,torch_dtype", [
    ("fp16", np.float16, rounding.round_fp16, torch.float16),
    ("bf16", ml_dtypes.bfloat16, rounding.round_bf16, torch.bfloat16),
])
def test_16bit_rne_exhaustive(name, dtype, ours, torch_dtype, bits_equal):
    x = _grid_probes(_all_patterns(dtype))
    x = np.concatenate([x, np.array([np.inf, -np.inf, np.nan, 1e38, -1e38, 1e-45, -1e-45], np.float32)])
    with np.errstate(over="ignore"):
        expected = torch.from_numpy(x.astype(dtype).astype(np.float32))
    got = ours(torch.from_numpy(x))
    bits_equal(got, expected)
    bits_equal(got, torch.from_numpy(x).to(torch_dtype).float())


def test_all_e4m3_codes_decode():
    codes = torch.arange(256, dtype=torch.uint8)
    expected = torch.from_numpy(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    got = rounding.e4m3_from_bits(codes)
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    assert torch.isnan(got).sum() == 2  # 0x7F and 0xFF only
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    assert got[~torch.isnan(got)].max() == 448 and got[1] == 2.0**-9
    finite = ~torch.isnan(got)
    assert torch.equal(rounding.e4m3_to_bits(got[finite]), codes[finite])


def test_all_e2m1_codes_decode():
    codes = torch.arange(16, dtype=torch.uint8)
    expected = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    got = rounding.e2m1_from_bits(codes)
    assert np.array_equal(got.numpy().view(np.int32), expected.view(np.int32))  # -0.0 at code 8
    assert torch.equal(rounding.e2m1_to_bits(got), codes)


def _random_with_ties(grid: np.ndarray, bound: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    probes = _grid_probes(grid)
    wide = (rng.standard_normal(n) * bound * np.exp2(rng.uniform(-12, 2, n))).astype(np.float32)
    return np.concatenate([probes, -probes, wide, np.array([bound * 1.01, -bound * 1.5, 1e30, -1e30, np.inf, -np.inf],
                                                           np.float32)])


@pytest.mark.parametrize("ours,dtype,bound", [
    (rounding.round_e4m3, ml_dtypes.float8_e4m3fn, 448.0),
    (rounding.round_e5m2, ml_dtypes.float8_e5m2, 57344.0),
    (rounding.round_e2m1, ml_dtypes.float4_e2m1fn, 6.0),
])
def test_small_float_rne_saturating(ours, dtype, bound, bits_equal):
    grid = np.arange(2 ** (8 if bound > 6 else 4), dtype=np.uint8).view(dtype).astype(np.float32)
    x = _random_with_ties(grid, bound, 20000, seed=3)
    # ml_dtypes: RNE; overflow is not saturating there, so saturate first (our documented rule)
    expected = np.clip(x, -bound, bound).astype(dtype).astype(np.float32)
    bits_equal(ours(torch.from_numpy(x)), torch.from_numpy(expected))
    assert torch.isnan(ours(torch.tensor([float("nan")]))).all()


def test_e2m1_ties_go_to_even_code():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, -0.25])
    expected = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, -0.0])
    assert torch.equal(rounding.round_e2m1(x), expected)
    assert torch.signbit(rounding.round_e2m1(x))[-1]

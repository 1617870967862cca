"""OCP MX formats: E8M0 block scales, element rounding, special blocks, padding."""

import ml_dtypes
import numpy as np
import torch

from replayssm_eval.formats import get_format


def _mx_reference(block: np.ndarray, dtype, emax: int, max_value: float) -> np.ndarray:
    amax = np.abs(block).max()
    if amax == 0:
        return np.zeros_like(block)
    x_scale = 2.0 ** (int(np.floor(np.log2(amax))) - emax)
    return np.clip(block / x_scale, -max_value, max_value).astype(dtype).astype(np.float32) * np.float32(x_scale)


def test_against_straightforward_reference():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 64)) * np.exp2(rng.uniform(-20, 20, (4, 1)))).astype(np.float32)
    for spec, dtype, emax, mx in [("mxfp8", ml_dtypes.float8_e4m3fn, 8, 448.0), ("mxfp4", ml_dtypes.float4_e2m1fn, 2, 6.0)]:
        got = get_format(spec).quantize(torch.from_numpy(x).view(1, 4, 64)).view(4, 64).numpy()
        expected = np.concatenate([np.concatenate([_mx_reference(r[i:i + 32], dtype, emax, mx) for i in (0, 32)])
                                   for r in x]).reshape(4, 64)
        assert np.array_equal(got, expected), spec


def test_special_blocks_and_padding():
    x = torch.zeros(1, 2, 40)
    x[0, 1, 5] = float("inf")
    x[0, 1, 35] = 3.0
    p = get_format("mxfp4").encode(x)
    assert p.data.shape == (1, 2, 32) and p.scales.shape == (1, 2, 2)
    assert p.scales[0, 0].tolist() == [127, 127]  # all-zero blocks: X = 1
    assert p.scales[0, 1].tolist() == [255, 126]  # Inf block -> NaN scale; amax 3 -> 2^(1 - 2)
    y = get_format("mxfp4").decode(p)
    assert torch.isnan(y[0, 1, :32]).all() and y[0, 1, 35] == 3.0 and y.shape == x.shape

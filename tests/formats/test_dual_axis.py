"""STEPQuant's dual-axis codec (arXiv 2609.38169, Section 4.3, Eq. 11-14, Appendix C.1) against a per-head numpy
reading of the paper's equations, its packing, its errors, and the kernels' FP64 row sums of a tile."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from replayssm_eval.formats import get_format
from replayssm_eval.formats.device import abs_sums
from replayssm_eval.formats.dual_axis import pack_codes, unpack_codes
from replayssm_eval.replay.config import ReplayConfig

from tests.helpers.device import TEST_DEVICE


def _stored(s):
    return np.float32(np.float16(np.clip(s, 2.0 ** -14, 65504.0)))


def _head(x: np.ndarray, q: int) -> np.ndarray:
    """One head `[d_k, d_v]` (key rows first): Eq. 12-13 with w_i = 1, codes by Eq. 3, one fixed-code column update."""
    r = _stored(np.sqrt(np.abs(x).astype(np.float64).mean(1)).astype(np.float32))[:, None]
    c0 = _stored(((np.abs(x) / r).max(0).astype(np.float64) / q).astype(np.float32))[None, :]
    z0 = np.clip(np.round(x / (r * c0)), -q, q)
    v = (r * z0).astype(np.float64)
    den = (v * v).sum(0)
    c = np.where(den > 0, _stored(((v * x).sum(0) / np.where(den > 0, den, 1.0)).astype(np.float32)), c0[0])[None, :]
    z = np.clip(np.round(x / (r * c)), -q, q).astype(np.float32)
    return z * (r * c)


def _reference(x: torch.Tensor, width: int) -> torch.Tensor:
    """x `[B, H, P, N]`; the paper's key rows are N (axis=headdim)."""
    xs = x.numpy()
    out = np.stack([np.stack([_head(h.T, 2 ** (width - 1) - 1).T for h in b]) for b in xs])
    return torch.from_numpy(out)


def _awkward_state(seed: int) -> torch.Tensor:
    """[2, 3, 5, 7]: an outlier row and column, a zero key row, a zero value column, an all-zero head."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 5, 7, generator=g) * torch.exp2(torch.randint(-6, 6, (2, 3, 1, 7), generator=g).float())
    x[0, 0] = 0.0
    x[0, 1, :, 2] = 0.0  # key row 2 of head 1
    x[1, 2, 3, :] = 0.0  # value column 3 of head 2
    x[1, 0, 1, 4] = 500.0
    return x


@pytest.mark.parametrize("width", [4, 6, 8])
def test_matches_the_papers_fit(width):
    x = _awkward_state(width)
    got = get_format(f"dualaxis:width={width}").quantize(x)
    assert torch.equal(got, _reference(x, width))
    assert (got[0, 0] == 0).all() and (got[0, 1, :, 2] == 0).all()
    dstate = get_format(f"dualaxis:axis=dstate,width={width}").quantize(x)  # rows along P
    assert torch.equal(dstate, _reference(x.transpose(-1, -2).contiguous(), width).transpose(-1, -2))


@triton.jit
def _abs_sums_kernel(x_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr):
    rows, cols = tl.arange(0, R), tl.arange(0, C)
    sums = abs_sums(tl.load(x_ptr + rows[:, None] * C + cols[None, :]), AXIS)
    tl.store(out_ptr + (cols if AXIS == 0 else rows), sums)


@pytest.mark.parametrize("rows,cols,axis", [(16, 128, 0), (128, 32, 1), (64, 16, 0), (8, 32, 0), (32, 8, 1)])
def test_abs_sums_of_a_tile(rows, cols, axis):
    """The FP64 sums of |x| behind the dual-axis row factors (a tl.dot with ones where the tile allows one): the
    exact sums where every order gives them (multiples of 2^-10 below 2^22: sums of 39 bits, more than FP32 holds),
    NaN where a NaN is summed, Inf where an Inf and no NaN is."""
    g = torch.Generator().manual_seed(rows + cols)
    x = torch.randint(-2**12, 2**12, (rows, cols), generator=g).float()
    x *= torch.exp2(torch.randint(-10, 10, (rows, cols), generator=g).float())
    x[1, 2], x[3, 4], x[5, 4], x[6, 6] = float("inf"), float("-inf"), float("nan"), float("-inf")
    x[0] = 0.0
    out = torch.empty(x.shape[1 - axis], dtype=torch.float64, device=TEST_DEVICE)
    _abs_sums_kernel[(1,)](x.to(TEST_DEVICE), out, R=rows, C=cols, AXIS=axis)
    want = x.abs().double().sum(axis)
    assert torch.equal(out.cpu().nan_to_num(nan=-1.0), want.nan_to_num(nan=-1.0))
    assert want.isnan().sum() == 1 and want.isinf().sum() == (2 if axis == 0 else 3)  # the test sees both kinds


def test_dual_axis_beats_row_scales_alone():
    """The column fit earns its bytes: on a state with outliers along both axes, the dual-axis codes beat one
    scale per row at the same code width."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 8, 32, 64, generator=g) * torch.exp2(3 * torch.rand(4, 8, 1, 64, generator=g))
    x = x * torch.exp2(3 * torch.rand(4, 8, 32, 1, generator=g))
    err = {spec: ((get_format(spec).quantize(x) - x).norm() / x.norm()).item()
           for spec in ("dualaxis:width=8", "int8:axis=headdim")}
    assert err["dualaxis:width=8"] < 0.85 * err["int8:axis=headdim"]


def test_packing_and_bytes():
    u = torch.tensor([[0, 5, 62, 63, 1]])
    assert torch.equal(unpack_codes(pack_codes(u, 6), 6, 5), u)
    assert pack_codes(torch.tensor([[1, 2, 3]]), 4).tolist() == [[0x21, 0x03]]
    x = _awkward_state(1)
    fmt = get_format("dualaxis")
    p = fmt.encode(x)
    assert p.data.shape == (2, 3, -(-35 * 6 // 8)) and p.global_scale.dtype == torch.float16
    assert p.global_scale.shape == (2, 3, 7) and p.col_scale.shape == (2, 3, 5)
    assert p.nbytes == fmt.storage_bytes(tuple(x.shape)) == 6 * (27 + 2 * 12) and fmt.bits_per_element == 6.0
    nan = x.clone()
    nan[1, 1, 0, 0] = float("inf")
    y = fmt.quantize(nan)
    assert torch.isnan(y[1, 1]).all() and torch.equal(y[1, 2], fmt.quantize(x)[1, 2])


@pytest.mark.parametrize("spec,message", [
    ("dualaxis:width=9", "bad value '9' for option 'width' of state format 'dualaxis'; accepted: 3..8"),
    ("dualaxis:width=06", "bad value '06' for option 'width' of state format 'dualaxis'; accepted: 6, N"),
    ("dualaxis:scale=row", "unknown option 'scale' for state format 'dualaxis'; accepted: axis, width, rot, ef"),
])
def test_bad_options(spec, message):
    with pytest.raises(ValueError, match=message):
        get_format(spec)


def test_presets_expand_to_window_one_configs():
    assert ReplayConfig.parse("stepquant:dualaxis6").name == "dualaxis"
    assert ReplayConfig.parse("stepquant:dualaxis8").name == "dualaxis:width=8"

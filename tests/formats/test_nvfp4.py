"""NVFP4 against an independent step-by-step NumPy transcription of TransformerEngine's reference."""

import numpy as np
import pytest
import torch

from replayssm_eval.formats import formats, get_format, rounding

from tests.helpers.nvfp4 import tie_rows

F32 = np.float32
E2M1_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)


def _e4m3_grid() -> np.ndarray:
    m = np.arange(8)
    sub = m * 2.0**-9
    normal = [(8 + m) * 2.0 ** (e - 10) for e in range(1, 16)]
    return np.unique(np.concatenate([sub, *normal])[:-1]).astype(F32)  # drop 480 (NaN code)


E4M3_GRID = _e4m3_grid()


def _rne(v: F32, grid: np.ndarray) -> F32:
    """Nearest grid value (|v| <= grid max), ties to the even code (grid index)."""
    a = abs(float(v))
    i = int(np.searchsorted(grid, a))
    if i < len(grid) and grid[i] == a:
        out = grid[i]
    else:
        lo, hi = grid[i - 1], grid[i]
        d_lo, d_hi = a - float(lo), float(hi) - a
        out = lo if d_lo < d_hi or (d_lo == d_hi and (i - 1) % 2 == 0) else hi
    return F32(-out if v < 0 else out)


def te_reference(x: np.ndarray) -> np.ndarray:
    """One row, one global scale (scale=tensor over the row), blocks of 16, FP32 scalar steps."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        amax = F32(np.max(np.abs(x)))
        s_enc = F32(min(F32(F32(2688.0) / amax), F32(np.finfo(F32).max)))
        if amax == 0 or s_enc == 0:
            s_enc = F32(1.0)
        s_dec = F32(F32(1.0) / s_enc)
        out = np.empty_like(x)
        for b in range(0, len(x), 16):
            blk = x[b:b + 16]
            v = F32(F32(np.max(np.abs(blk))) * F32(s_enc * F32(1 / 6)))
            s_b = _rne(F32(min(v, F32(448))), E4M3_GRID)
            enc = F32(min(F32(F32(1.0) / F32(s_b * s_dec)), F32(np.finfo(F32).max)))
            for j, xv in enumerate(blk):
                q = _rne(F32(np.clip(F32(xv * enc), -6, 6)), E2M1_GRID)
                out[b + j] = F32(F32(q * s_b) * s_dec)
    return out


def _cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    gauss = rng.standard_normal(64).astype(F32)
    # exact E2M1 ties: amax 6 -> S_enc = 448, s_b = blockmax*448/6 exactly on the E4M3 grid
    ties = np.array([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -5, -0.25, 0, 0, 0, 0, 0, 0] * 2, F32)
    # a block far below the global max: its scale is an E4M3 subnormal
    sub = np.concatenate([np.full(16, 1000.0, F32), rng.standard_normal(16).astype(F32) * F32(2e-3)])
    zeros = np.concatenate([gauss[:16], np.zeros(16, F32)])
    tiny_amax = np.full(16, 1e-30, F32)  # S_enc = 2688/1e-30 > FLT_MAX -> FLT_MAX
    return {"gauss": gauss, "ties": ties, "subnormal_scale": sub, "zero_block": zeros, "all_zero": np.zeros(16, F32),
            "tiny_amax": tiny_amax}


@pytest.mark.parametrize("case", list(_cases()))
def test_golden_vectors(case, bits_equal):
    x = _cases()[case]
    got = get_format("nvfp4").quantize(torch.from_numpy(x).view(1, 1, -1))
    bits_equal(got.view(-1), torch.from_numpy(te_reference(x)))


def test_subnormal_block_scale_is_stored():
    x = torch.from_numpy(_cases()["subnormal_scale"]).view(1, 1, -1)
    scales = get_format("nvfp4").encode(x).scales.view(-1)
    assert 0 < scales[1] < 8  # E4M3 subnormal codes 1..7


def test_non_finite(bits_equal):
    fmt = get_format("nvfp4:scale=row")
    x = torch.ones(1, 3, 32)
    x[0, 0, 3] = float("nan")
    x[0, 1, 20] = float("inf")
    y = fmt.quantize(x)
    assert torch.isnan(y[0, 0]).all()  # NaN poisons its global group
    assert y[0, 1, 20] == 6 * 448  # Inf: S_enc = 1, s_b = 448, element 6
    assert torch.equal(y[0, 1, 16:20], torch.zeros(4))  # 1 * (1/448) rounds to 0 in the Inf block
    bits_equal(y[0, 1], torch.from_numpy(te_reference(x[0, 1].numpy())))
    assert torch.equal(y[0, 2], torch.ones(32))  # other rows untouched


def test_padding_and_nibble_order():
    x = torch.tensor([[[0.5, 1.0, 6.0, -6.0, 3.0]]])  # N = 5 -> one zero-padded block of 16
    p = get_format("nvfp4").encode(x)
    assert p.data.shape == (1, 1, 8) and p.scales.shape == (1, 1, 1)
    # amax 6 -> S_enc 448, s_b = 448 (code 0x7E), enc_b = 1: codes 0.5->1, 1->2, 6->7, -6->15, 3->5
    assert p.scales.item() == 0x7E and p.global_scale.item() == pytest.approx(1 / 448)
    assert p.data[0, 0, :3].tolist() == [1 | 2 << 4, 7 | 15 << 4, 5]


def test_torchao_known_differences():
    """torchao's nvfp4_quantize never stores a subnormal block scale and scales by reciprocals; TE does neither."""
    nvfp4_tensor = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    x = torch.from_numpy(_cases()["subnormal_scale"]).view(1, 32)
    amax = x.abs().max()
    ao_scales, _ = nvfp4_tensor.nvfp4_quantize(x, per_tensor_scale=amax / (448 * 6))
    ours = get_format("nvfp4").encode(x.view(1, 1, 32)).scales.view(-1)
    assert ao_scales.view(torch.uint8).view(-1)[1] >= 8  # torchao clamps the scale to the smallest normal
    assert ours[1] < 8  # TE keeps the subnormal scale
    # on ordinary data the two agree on almost every code
    g = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    ao_scales, ao_data = nvfp4_tensor.nvfp4_quantize(g, per_tensor_scale=g.abs().max() / (448 * 6))
    p = get_format("nvfp4").encode(g.view(1, 64, 256))
    same = (ao_data.view(torch.uint8).view(-1) == p.data.view(-1)).float().mean().item()
    assert same > 0.98


def test_negative_zero_is_code_zero(bits_equal):
    """-0.0 encodes as code 0 (TE's reference takes the sign from x < 0); a negative value rounding to 0 keeps code 8."""
    x = np.array([-0.0, 0.0, 6.0, -0.2, -0.0] + [1.0] * 11, F32)
    p = get_format("nvfp4").encode(torch.from_numpy(x).view(1, 1, 16))
    codes = [(b >> s) & 0xF for b in p.data.view(-1).tolist() for s in (0, 4)]
    assert codes[:5] == [0, 0, 7, 8, 0]  # -0.2 * enc_b = -0.2: rounds to -0, code 8
    y = get_format("nvfp4").quantize(torch.from_numpy(x).view(1, 1, 16)).view(-1)
    bits_equal(y, torch.from_numpy(te_reference(x)))
    assert not torch.signbit(y[0]) and torch.signbit(y[3])


@pytest.mark.parametrize("spec,negative_zero", [("fp32", True), ("bf16", True), ("fp16", True), ("fp8", True),
                                                ("fp8e5m2", True), ("mxfp8", True), ("mxfp4", True), ("int8", False),
                                                ("int16", False), ("nvfp4", False)])
def test_negative_zero_per_format(spec, negative_zero):
    """Which formats keep the sign of a -0.0 input: the IEEE-like codes do (they have a -0), the integer codes
    and NVFP4 (TE's reference) do not; mxfp4 keeps it (code 8), as a plain E2M1 cast does."""
    x = torch.full((1, 1, 32), -0.0)
    x[0, 0, 1] = 1.0
    assert bool(torch.signbit(get_format(spec).quantize(x)[0, 0, 0])) == negative_zero


def test_block_scale_order_of_operations_golden():
    """64 rows whose second block scale is an E4M3 tie decided by the order of the FP32 products (scripts/nvfp4_ties.py)."""
    x, scales = tie_rows()
    assert torch.equal(get_format("nvfp4").encode(x).scales.view(64, 2), scales)
    for fmt in ("nvfp4:scale=row", "nvfp4:scale=tensor"):  # one row per state: the same global group
        assert torch.equal(get_format(fmt).encode(x).scales.view(64, 2), scales)


def test_block_scale_other_order_fails_the_golden(monkeypatch):
    x, scales = tie_rows()
    monkeypatch.setattr(formats, "nvfp4_block_scale", lambda bmax, s_enc: rounding.round_e4m3((bmax / 6.0) * s_enc))
    got = get_format("nvfp4").encode(x).scales.view(64, 2)
    assert torch.equal(got[:, 0], scales[:, 0]) and (got[:, 1] != scales[:, 1]).all()

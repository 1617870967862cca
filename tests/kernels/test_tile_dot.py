"""`tile_dot.dot`: the chunked kernels' FP32 product, with the one-row, one-column and one-term shapes of one-token
windows as 2D broadcasts, == torch's product; `window_rows`."""

import pytest
import torch
import triton
import triton.language as tl

from replayssm_eval.kernels.tile_dot import dot, window_rows


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, C: tl.constexpr, N: tl.constexpr, DOT: tl.constexpr):
    # a [M, C], b [C, N], c [M, N] row-major FP32
    m, k, n = tl.arange(0, M), tl.arange(0, C), tl.arange(0, N)
    a = tl.load(a_ptr + m[:, None] * C + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], dot(a, b, DOT))


@pytest.mark.parametrize("m, c, n", [(1, 128, 32), (1, 32, 1), (128, 1, 32), (1, 1, 64), (64, 128, 1), (16, 32, 16)])
@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_dot_matches_torch(m, c, n, precision, device):
    gen = torch.Generator().manual_seed(m * 1000 + c * 10 + n)
    a = torch.randn(m, c, generator=gen, dtype=torch.float64) * torch.logspace(-3, 3, c, dtype=torch.float64)
    b = torch.randn(c, n, generator=gen, dtype=torch.float64)
    out = torch.empty(m, n, device=device)
    _dot_kernel[(1,)](a.float().to(device), b.float().to(device), out, m, c, n, precision)
    want = a.float().double() @ b.float().double()  # the exact products' sum
    scale = (a.float().double().abs() @ b.float().double().abs()).clamp_min(1e-30)
    err = ((out.cpu().double() - want).abs() / scale).max().item()
    assert err < 1e-6, f"[{m}, {c}] @ [{c}, {n}] ({precision}): relative error {err:.2e}"
    if c == 1:  # an outer product: one rounding per element, exact as torch's
        assert torch.equal(out.cpu(), a.float() * b.float())


def test_window_rows():
    assert [window_rows(n) for n in (1, 2, 3, 16, 17, 64)] == [1, 16, 16, 16, 32, 64]

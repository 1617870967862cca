"""`tile_dot.dot`: the chunked kernels' FP32 product, with the one-row, one-column and one-term shapes of one-token
windows as 2D broadcasts, == torch's product; `dot_acc` over chunks == one product; `window_rows`."""

import pytest
import torch
import triton
import triton.language as tl

from replayssm_eval.kernels.tile_dot import dot, dot_acc, window_rows


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


@triton.jit
def _dot_acc_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, C: tl.constexpr, N: tl.constexpr, CHUNK: tl.constexpr,
                    DOT: tl.constexpr):
    # c = a @ b accumulated over chunks of CHUNK along C, from c's initial contents
    m, n = tl.arange(0, M), tl.arange(0, N)
    acc = tl.load(c_ptr + m[:, None] * N + n[None, :])
    for c0 in tl.static_range(0, C, CHUNK):
        k = c0 + tl.arange(0, CHUNK)
        acc = dot_acc(tl.load(a_ptr + m[:, None] * C + k[None, :]), tl.load(b_ptr + k[:, None] * N + n[None, :]), acc,
                      DOT)
    tl.store(c_ptr + m[:, None] * N + n[None, :], acc)


@pytest.mark.parametrize("m, c, n", [(16, 128, 16), (1, 64, 32), (32, 96, 1)])
@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_dot_acc_over_chunks_is_one_product(m, c, n, precision, device):
    gen = torch.Generator().manual_seed(m + c + n)
    a = torch.randn(m, c, generator=gen) * torch.logspace(-2, 2, c)
    b = torch.randn(c, n, generator=gen)
    acc = torch.randn(m, n, generator=gen)
    out = acc.clone().to(device)
    _dot_acc_kernel[(1,)](a.to(device), b.to(device), out, m, c, n, 32, precision)
    want = acc.double() + a.double() @ b.double()
    scale = (acc.double().abs() + a.double().abs() @ b.double().abs()).clamp_min(1e-30)
    err = ((out.cpu().double() - want).abs() / scale).max().item()
    assert err < 1e-6, f"[{m}, {c}] @ [{c}, {n}] in chunks of 32 ({precision}): relative error {err:.2e}"


def test_window_rows():
    assert [window_rows(n) for n in (1, 2, 3, 16, 17, 64)] == [1, 16, 16, 16, 32, 64]

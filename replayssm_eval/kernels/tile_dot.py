"""The chunked kernels' FP32 matrix product `dot`, and `window_rows`, the rows of a window's tile.

tl.dot needs every dim of at least 16, so a kernel that walks one-token windows (window 1: conventional decoding,
the state rounded after every token) would pad each window to 16 rows and do 16 times the work. With one row per
window every product of the kernels is an outer product, a row times a matrix or a matrix times a column, which
`dot` computes as 2D broadcasts instead. `dot_acc` is the same product added into an accumulator, `add_dot` a fold's
sum of a scaled state and a product.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dot(a, b, DOT: tl.constexpr):
    """a [M, C] @ b [C, N] in FP32: tl.dot with input_precision DOT ("ieee": FMAs; "tf32x3": three TF32 tensor-core
    products, FP32-level error) where every dim is at least 16; with one row, column or term (a one-token window's
    products) a 2D broadcast: exact products, summed over C in FP32."""
    if tl.constexpr(a.shape[1] == 1):  # an outer product
        c = a * b
    elif tl.constexpr(a.shape[0] == 1):  # a row times a matrix
        c = tl.sum(tl.trans(a) * b, axis=0)[None, :]
    elif tl.constexpr(b.shape[1] == 1):  # a matrix times a column
        c = tl.sum(a * tl.trans(b), axis=1)[:, None]
    else:
        c = tl.dot(a, b, input_precision=DOT)
    return c


@triton.jit
def dot_acc(a, b, acc, DOT: tl.constexpr):
    """acc + a @ b as `dot`. tl.dot accumulates into acc (under "ieee", FMAs onward from acc: a product over C taken
    in chunks in order gave the bits of one product over the whole of C on the H200); the 2D broadcasts (one-row
    products) add each chunk's sum."""
    if tl.constexpr((a.shape[0] == 1) | (a.shape[1] == 1) | (b.shape[1] == 1)):
        c = acc + dot(a, b, DOT)
    else:
        c = tl.dot(a, b, acc, input_precision=DOT)
    return c


@triton.jit
def add_dot(acc, a, b, DOT: tl.constexpr):
    """acc + a @ b, the product as `dot` and the sum rounded once more; an outer product (a one-token window's fold) as
    one FMA per element, fma(a, b, acc): the GPU compiler contracts acc + a * b into an FMA on either product, and not
    alike in every kernel (the interpreter rounds both ways alike)."""
    if tl.constexpr(a.shape[1] == 1):
        c = tl.fma(tl.broadcast_to(a, acc.shape), tl.broadcast_to(b, acc.shape), acc)
    else:
        c = acc + dot(a, b, DOT)
    return c


def window_rows(length: int) -> int:
    """Rows of the tile holding a window of `length` entries: one for one-token windows, else the power of two of at
    least 16 that holds it (tl.dot's minimum)."""
    return 1 if length == 1 else max(16, triton.next_power_of_2(length))

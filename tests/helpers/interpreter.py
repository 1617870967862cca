"""The Triton interpreter's FP32 `tl.dot` made independent of the host.

The interpreter multiplies FP32 tiles with numpy's matmul, that is the host's BLAS sgemm, whose order of additions
depends on the CPU's kernels (AVX2 or AVX-512) and on the operands' shapes and strides. Two kernel paths taking the
same product in tiles of different sizes then differ in a last bit on some hosts (an AMD AVX2 machine: a row's amax,
so a whole row's scale), which a bit-for-bit comparison of the two paths reads as a bug. `exact_fp32_dot` takes the
FP32 products in FP64 (each product exact, a tile's sum of at most a few hundred of them far within an FP32 ulp) and
rounds the sum to FP32 once: the same bits on every host and for every tiling, but where an FP64 sum lies at an FP32
rounding boundary.
"""

from __future__ import annotations

import numpy as np
from triton.runtime import interpreter


def exact_fp32_dot() -> None:
    """Replace the interpreter's `tl.dot` of FP32 operands by the exact product rounded once (other dtypes as
    before); the accumulator is added after, in FP32, as the interpreter does."""
    blas_dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype != np.float32 or b.data.dtype != np.float32:
            return blas_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        product = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64)).astype(np.float32)
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = create_dot

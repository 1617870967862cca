"""The Triton interpreter made independent of the host and quicker.

`exact_fp32_dot`: the interpreter's FP32 `tl.dot` made independent of the host.

The interpreter multiplies FP32 tiles with numpy's matmul, that is the host's BLAS sgemm, whose order of additions
depends on the CPU's kernels (AVX2 or AVX-512) and on the operands' shapes and strides. Two kernel paths taking the
same product in tiles of different sizes then differ in a last bit on some hosts (an AMD AVX2 machine: a row's amax,
so a whole row's scale), which a bit-for-bit comparison of the two paths reads as a bug. `exact_fp32_dot` takes the
FP32 products in FP64 (each product exact, a tile's sum of at most a few hundred of them far within an FP32 ulp) and
rounds the sum to FP32 once: the same bits on every host and for every tiling, but where an FP64 sum lies at an FP32
rounding boundary.

`skip_repeated_interpreter_work`: the interpreter patches `triton.language` for a launch and restores it after, and
patches it again at every call of a `@triton.jit` helper inside it (`inspect.getmembers` of four modules, a new
closure per builtin; never restored, the launch's restore undoes them). The kernels call helpers per tile and per
format, so that was a third of a kernel test's time. Inside a launch whose patches already cover a helper's language
modules, the helper's are skipped; they were the same functions over the same builder. Numpy's dtype of a Triton
scalar type is looked up once per type rather than from a dict built at every lookup.
"""

from __future__ import annotations

import functools

import numpy as np
import triton.language as tl
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


def skip_repeated_interpreter_work() -> None:
    """Skip the interpreter's re-patching of `triton.language` at helper calls inside a launch that patched it; look
    up numpy's dtype of a Triton scalar type once (the interpreter builds a dict of 12 types at every lookup)."""
    patch_language, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    launches: list[frozenset | None] = []  # per launch in progress: the language modules patched (None: not yet)

    @functools.cache
    def languages(fn) -> frozenset:
        return frozenset(id(value) for value in fn.__globals__.values() if value is tl or value is tl.core)

    def patch_once(fn):
        wanted = languages(fn)
        if launches and launches[-1] is not None and wanted <= launches[-1]:
            return None  # a helper's patches: the interpreter discards what `_patch_lang` returns
        if launches:
            launches[-1] = wanted | (launches[-1] or frozenset())
        return patch_language(fn)

    def launch_patched_once(self, *args, **kwargs):
        launches.append(None)
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    np_dtype, scalar_np_dtype = interpreter._get_np_dtype, functools.cache(interpreter._get_np_dtype)

    def cached_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        return scalar_np_dtype(tt_dtype) if type(tt_dtype) is tl.dtype else np_dtype(tt_dtype)  # pointers: unhashable

    interpreter._patch_lang = patch_once
    interpreter._get_np_dtype = cached_np_dtype
    interpreter.GridExecutor.__call__ = launch_patched_once

"""The shared comparisons of tests/helpers bound what they admit; the interpreter's FP32 dot is the exact product
rounded once, and its language patches are taken once per launch and undone after it."""

import ast
import dataclasses
import os
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from replayssm_eval.kernels.mamba2 import decode_reference

from tests.helpers.compare import assert_close, assert_same_state, mostly_equal
from tests.helpers.mamba2 import mamba2_inputs


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, C: tl.constexpr, N: tl.constexpr):
    # c [M, N] = a [M, C] @ b [C, N], row-major FP32
    m, k, n = tl.arange(0, M), tl.arange(0, C), tl.arange(0, N)
    a = tl.load(a_ptr + m[:, None] * C + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b, input_precision="ieee"))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's dot (helpers.interpreter)")
def test_interpreter_dot_is_the_exact_product_rounded_once():
    """Rows whose FP32 running sums lose terms in any order that meets +-2^24 before the ones (and random rows, of
    products exact in FP64): the interpreter's dot gives the exact sum rounded once, for a tile and its transpose's."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(16, 32, generator=gen) * torch.logspace(-4, 4, 32)
    a[0] = 1.0
    a[0, 3], a[0, 29] = 2.0**24, -(2.0**24)
    b = torch.randn(32, 16, generator=gen)
    b[:, 0] = 1.0
    want = (a.double() @ b.double()).float()
    assert want[0, 0] == 30.0
    for x, y, expected in ((a, b, want), (b.T.contiguous(), a.T.contiguous(), want.T)):
        out = torch.empty(x.shape[0], y.shape[1])
        _dot_kernel[(1,)](x, y, out, x.shape[0], x.shape[1], y.shape[1])
        assert torch.equal(out, expected)


@triton.jit
def _clamped(x, low, high):
    return tl.minimum(tl.maximum(x, low), high)


@triton.jit
def _clamp_rows_kernel(x_ptr, out_ptr, N: tl.constexpr):
    # out [2, N] = x clamped to [-1, 1] (row 0) and to [0, 2] (row 1), through nested helper calls
    n = tl.arange(0, N)
    x = tl.load(x_ptr + n)
    tl.store(out_ptr + n, _clamped(x, -1.0, 1.0))
    tl.store(out_ptr + N + n, _clamped(_clamped(x, 0.0, 5.0), -5.0, 2.0))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's patches (helpers.interpreter)")
def test_interpreter_patches_the_language_once_per_launch(monkeypatch):
    """Two launches of a kernel with three helper calls each patch `triton.language` twice, not eight times; the
    helpers compute as before, and where the interpreter undoes a launch's patches (triton 3.6; 3.4 leaves them in
    place), `tl.minimum` is the language's own function again after each launch."""
    minimum, patch_core = tl.minimum, interpreter._patch_lang_core
    restores = hasattr(interpreter, "_LangPatchScope")
    patches = []  # one per patching of `tl` (this module's only language module)
    monkeypatch.setattr(interpreter, "_patch_lang_core",
                        lambda lang, *scope: patches.append(lang) or patch_core(lang, *scope))
    x = torch.linspace(-3, 3, 16)
    for _ in range(2):
        out = torch.empty(2, 16)
        _clamp_rows_kernel[(1,)](x, out, 16)
        assert torch.equal(out, torch.stack([x.clamp(-1, 1), x.clamp(0, 2)]))
        assert tl.minimum is minimum or not restores
    assert patches == [tl, tl]


def test_assert_close_bounds_each_flip():
    """A flip budget of 1% admits 65 of 6,660 elements one grid step off, never 65 elements at 1e6."""
    ref = torch.randn(6660, generator=torch.Generator().manual_seed(0))
    stepped = ref.clone()
    stepped[:65] += 0.1 * ref.abs().max()
    assert_close("stepped", ref, stepped, 1e-5, flips=0.01)
    wild = ref.clone()
    wild[:65] = 1e6
    with pytest.raises(AssertionError, match="more than a flipped rounding"):
        assert_close("wild", ref, wild, 1e-5, flips=0.01)
    with pytest.raises(AssertionError, match=r"allowed 0.50%"):
        assert_close("too many", ref, stepped, 1e-5, flips=0.005)


def test_mostly_equal_bounds_each_flip():
    """A 1% flip budget admits 65 of 6,660 elements one grid step off, never 65 elements at 1e6."""
    ref = torch.randn(6660, generator=torch.Generator().manual_seed(0))
    stepped, wild = ref.clone(), ref.clone()
    stepped[:65] += 0.1 * ref.abs().max()
    wild[:65] = 1e6
    mostly_equal("stepped", ref, stepped, 0.99)
    with pytest.raises(AssertionError, match="more than a flipped rounding"):
        mostly_equal("wild", ref, wild, 0.99)


def test_assert_same_state_checks_the_valid_buffer_entries():
    """Entries [0, count) must match; a stale ring slot past the count only with whole_buffer."""
    _, state = decode_reference(*mamba2_inputs(batch=2, tokens=3), "nvfp4/fp16sr@4", compute_dtype=torch.float64)
    assert state.schedule.count.tolist() == [3, 3]
    assert_same_state(state, state)

    def changed(slot):
        buffer = {k: v.clone() for k, v in state.buffer.items()}
        buffer["x"][:, slot] += 1.0
        return dataclasses.replace(state, buffer=buffer)

    assert_same_state(state, changed(3))
    with pytest.raises(AssertionError, match=r"buffer\['x'\]: max abs error"):
        assert_same_state(state, changed(3), whole_buffer=True)
    with pytest.raises(AssertionError, match=r"buffer\['x'\] of sequence 0"):
        assert_same_state(state, changed(2))


def test_test_modules_import_shared_code_only_through_the_tests_package():
    """A bare `import conftest` (or any module beside a test) resolves to whichever same-named file pytest
    imported first, so collecting two folders together breaks; shared code comes from `tests.helpers`."""
    tests = Path(__file__).parent
    local = {p.stem for p in tests.rglob("*.py")} - {"__init__"}
    bare = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bare += [f"{path.relative_to(tests)}: {n}" for n in names if n.split(".")[0] in local]
    assert bare == []
    assert "conftest" in local and "compare" in local  # the names the check looks for are there to find

"""Shared test setup.

Triton kernels run in the interpreter on machines without a GPU; the variable must be set before
any module defining a `@triton.jit` function is imported, so it is set here, first. The interpreter
computes every lane with numpy, masked-out lanes and deliberate inf / NaN inputs included, and numpy
warns on the overflows and zero divisions that IEEE arithmetic on a GPU performs silently: those
RuntimeWarnings of the interpreter's module are ignored.

Each pytest-xdist worker computes on one thread (torch's intra-op pool and numpy's BLAS, which the
interpreter's `tl.dot` uses): with one worker per core, more threads per worker oversubscribe the
cores, and a quick-tier file then ran 6x slower. Set before torch or numpy is imported.

The interpreter's FP32 `tl.dot` is taken exactly and rounded once (`tests.helpers.interpreter`), so that two kernel
paths tiling the same product differently agree bit for bit on every host, whatever its BLAS kernels, and
`triton.language` is patched once per launch rather than again at every helper call (a third of a kernel test's time).
"""

import os

from tests.helpers.device import TEST_DEVICE

if TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
if "PYTEST_XDIST_WORKER" in os.environ:
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.helpers.interpreter import exact_fp32_dot, skip_repeated_interpreter_work  # noqa: E402


def pytest_configure(config):
    if os.environ.get("TRITON_INTERPRET") == "1":
        config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
        exact_fp32_dot()
        skip_repeated_interpreter_work()


@pytest.fixture
def device() -> str:
    """Device under test (`tests.helpers.device`)."""
    return TEST_DEVICE


@pytest.fixture(autouse=True)
def _fixed_seed():
    torch.manual_seed(0)

"""Shared test setup.

Triton kernels run in the interpreter on machines without a GPU; the variable must be set before
any module defining a `@triton.jit` function is imported, so it is set here, first. The interpreter
computes every lane with numpy, masked-out lanes and deliberate inf / NaN inputs included, and numpy
warns on the overflows and zero divisions that IEEE arithmetic on a GPU performs silently: those
RuntimeWarnings of the interpreter's module are ignored.
"""

import os

from tests.helpers.device import TEST_DEVICE

if TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_configure(config):
    if os.environ.get("TRITON_INTERPRET") == "1":
        config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture
def device() -> str:
    """Device under test (`tests.helpers.device`)."""
    return TEST_DEVICE


@pytest.fixture(autouse=True)
def _fixed_seed():
    torch.manual_seed(0)

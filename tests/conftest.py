"""Shared test setup.

Triton kernels run in the interpreter on machines without a GPU; the variable must be set before
any module defining a `@triton.jit` function is imported, so it is set here, first.
"""

import os

from tests.helpers.device import TEST_DEVICE

if TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def device() -> str:
    """Device under test (`tests.helpers.device`)."""
    return TEST_DEVICE


@pytest.fixture(autouse=True)
def _fixed_seed():
    torch.manual_seed(0)

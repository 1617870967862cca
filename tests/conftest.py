"""Shared test setup.

Triton kernels run in the interpreter on machines without a GPU; the variable must be set before
any module defining a `@triton.jit` function is imported, so it is set here, first.
"""

import os

TEST_DEVICE = os.environ.get("REPLAYSSM_TEST_DEVICE", "cpu")
if TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def device() -> str:
    """Device under test: `REPLAYSSM_TEST_DEVICE=cuda pytest` runs the same tests on the GPU."""
    return TEST_DEVICE


@pytest.fixture(autouse=True)
def _fixed_seed():
    torch.manual_seed(0)

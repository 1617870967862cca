"""Helpers for the state-format tests."""

import pytest

from tests.helpers.compare import assert_bits_equal


@pytest.fixture
def bits_equal():
    return assert_bits_equal

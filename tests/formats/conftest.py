"""Helpers for the state-format tests."""

import pytest
import torch


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bitwise equality of FP32 tensors (NaN positions must match; NaN payloads are free)."""
    a, b = a.float(), b.float()
    assert a.shape == b.shape
    nan = torch.isnan(a)
    assert torch.equal(nan, torch.isnan(b)), f"NaN positions differ at {int((nan != torch.isnan(b)).sum())} places"
    ai, bi = a.view(torch.int32)[~nan], b.view(torch.int32)[~nan]
    bad = ai != bi
    assert not bad.any(), (
        f"{int(bad.sum())} of {ai.numel()} differ, e.g. {a[~nan][bad][:4].tolist()} vs {b[~nan][bad][:4].tolist()}")


@pytest.fixture
def bits_equal():
    return _bits_equal

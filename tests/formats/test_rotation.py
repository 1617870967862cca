"""rot=hadamard:N: orthonormality, a known answer, the FP32 round trip, and lower INT8 error on outliers."""

import math

import pytest
import torch

from replayssm_eval.formats import get_format
from replayssm_eval.formats.rotation import Rotated, hadamard


@pytest.mark.parametrize("n", [1, 2, 4, 8, 32, 128])
def test_orthonormal(n):
    h = hadamard(n)
    assert torch.equal(h.abs(), torch.full((n, n), 1 / math.sqrt(n), dtype=torch.float64))
    assert torch.allclose(h @ h.T, torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-15)


def test_known_answer():
    """H_4 x for x = (1, 2, 3, 4): (10, -2, -4, 0) / 2, along d_state; along head_dim with axis=headdim."""
    fmt = get_format("fp32:rot=hadamard:4")
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 4)
    assert fmt.rotate(x).view(-1).tolist() == [5.0, -1.0, -2.0, 0.0]
    col = get_format("int8:axis=headdim,rot=hadamard:4")
    assert col.rotate(x.view(1, 4, 1)).view(-1).tolist() == [5.0, -1.0, -2.0, 0.0]
    assert torch.equal(fmt.quantize(x), x)  # exact here: every sum is exact in FP32


@pytest.mark.parametrize("spec", ["fp32:rot=hadamard:32", "int16:axis=headdim,rot=hadamard:16", "fp32:rot=hadamard:2"])
def test_roundtrip_is_tight_but_not_bit_exact(spec):
    fmt = get_format(spec)
    x = torch.randn(3, 4, 48, 64, generator=torch.Generator().manual_seed(0))
    y = fmt.quantize(x)
    rel = ((y - x).norm() / x.norm()).item()
    limit = 1e-7 if fmt.base == "fp32" else 3e-5  # fp32: one FP32 rounding each way; int16: its own error
    assert rel < limit
    if fmt.base == "fp32":
        assert not torch.equal(y, x)  # H and H^T only cancel up to rounding


def test_decoded_copy_is_in_the_original_basis_and_rotated_codes_differ():
    x = torch.randn(2, 3, 8, 64)
    plain, rot = get_format("int8"), get_format("int8:rot=hadamard:64")
    assert isinstance(rot, Rotated) and rot.storage_bytes(x.shape) == plain.storage_bytes(x.shape)
    p = rot.encode(x)
    assert p.format == rot.name and p.nbytes == rot.storage_bytes(x.shape)
    assert not torch.equal(p.data, plain.encode(x).data)
    assert ((rot.decode(p) - x).norm() / x.norm()).item() < 0.01


def test_sr_inner_format_keeps_its_seed():
    x = torch.randn(2, 3, 4, 32)
    fmt = get_format("int8sr:rot=hadamard:32")
    assert fmt.is_stochastic
    assert torch.equal(fmt.quantize(x, seed=4), fmt.quantize(x, seed=4))
    assert not torch.equal(fmt.quantize(x, seed=4), fmt.quantize(x, seed=5))


def test_hadamard_reduces_int8_error_on_outliers():
    """Rows with a few 100x outliers: per-row INT8 loses the small entries; the 32-wide rotation spreads the outliers."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 32, 128, generator=g)
    spikes = torch.rand(x.shape, generator=g) < 0.01
    x = torch.where(spikes, 100 * x, x)

    def err(spec):
        return ((get_format(spec).quantize(x) - x).norm() / x.norm()).item()

    assert err("int8:rot=hadamard:32") < 0.5 * err("int8")
    # NVFP4's 16-wide block scales already isolate the outliers; spreading them over the block hurts
    assert err("nvfp4:rot=hadamard:16") > err("nvfp4")


def test_bad_length():
    with pytest.raises(ValueError, match=r"rot=hadamard:32 needs the dstate dim \(48\) to be a multiple of 32"):
        get_format("int8:rot=hadamard:32").encode(torch.randn(2, 4, 48))

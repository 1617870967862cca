"""The kernel-family registry and the call convention every family shares (one test body per family)."""

import pytest
import torch

from replayssm_eval.kernels.family import family_names, get_family

from tests.helpers.device import TEST_DEVICE


def _inputs(fam, tokens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    inputs, anchor = fam.random_inputs(fam.test_shapes["small"], tokens, gen)
    return [inputs[name] for name in fam.inputs], anchor


def _cut(tensors, a, b):
    return [t[:, a:b] if t.dim() > 1 else t for t in tensors]


def _rel(got, want):
    return ((got - want).norm() / want.norm()).item()


def test_registry_lookups_and_errors():
    assert family_names() == ("mamba2", "gdn", "kda")
    with pytest.raises(ValueError, match="^unknown kernel family 'nope'; known: mamba2, gdn, kda$"):
        get_family("nope")


@pytest.mark.parametrize("name", family_names())
def test_description_is_consistent(name):
    fam = get_family(name)
    assert fam.name == name and set(fam.shapes) == set(fam.inputs)
    for shape in fam.test_shapes.values():
        tensors, anchor = fam.random_inputs(shape, 3, torch.Generator().manual_seed(1))
        assert list(tensors) == list(fam.inputs) and anchor.shape[0] == shape["B"]
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        fam.chunked(*_inputs(fam, 2)[0], _inputs(fam, 2)[1], "fp32", backend="cuda")


@pytest.mark.parametrize("name", family_names())
def test_hf_state_and_stored_layout_round_trip(name):
    """fp32 at window 1 stores the FP32 state: hf_state gives it back in the HF layout, as the recurrence left it."""
    fam = get_family(name)
    tensors, anchor = _inputs(fam, 0)
    _, state = fam.decode_reference(*tensors, anchor, "fp32")
    assert torch.equal(fam.hf_state(state), anchor)
    assert torch.equal(state.hi, fam.stored_layout(anchor))


@pytest.mark.parametrize("name", family_names())
def test_decode_step_and_verify_equal_the_reference(name):
    """decode_step (one token) and verify (drafts, no flush) in the shared convention == decode_reference."""
    fam = get_family(name)
    cfg = "nvfp4/fp32@8"
    tensors, anchor = _inputs(fam, 7)
    tensors, anchor = [t.to(TEST_DEVICE) for t in tensors], anchor.to(TEST_DEVICE)  # the Triton launches' device
    _, state = fam.decode_reference(*_cut(tensors, 0, 3), anchor, cfg)
    want, want_state = fam.decode_reference(*_cut(tensors, 3, 7), state, cfg)
    got, got_state = fam.decode_step(*_cut(tensors, 3, 4), state, cfg)
    assert got.shape == want[:, :1].shape and _rel(got, want[:, :1]) < 1e-5
    drafts = fam.verify(*_cut(tensors, 3, 7), state, cfg)
    assert drafts.shape == want.shape and _rel(drafts, want) < 1e-5
    assert torch.equal(want_state.checkpoint, state.checkpoint)  # no flush: verify's case

"""Fixtures of the KL driver tests: the fake model (`tests.helpers.kl_fakes`) and a small default run."""

import dataclasses

import pytest
import torch

from replayssm_eval.kl.options import KLConfig

from tests.helpers.kl_fakes import FAKE_MODEL, install


@pytest.fixture(autouse=True)
def _one_thread():
    """The fake's tensors are tiny: intra-op threads only add overhead (milliseconds per op on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fake(monkeypatch):
    """Install the fake model; returns a function to reinstall it (with `fail_after`, `fault`) and the runners list."""

    def setup(fail_after=None, fault=None):
        return install(fail_after, fault, setattr=monkeypatch.setattr)

    return setup


@pytest.fixture
def small(tmp_path):
    """A short run on the bundled text: 3 documents of 40 + 150 tokens, segments of 32."""

    def make(**changes):
        base = KLConfig(model=FAKE_MODEL, config=("fp32", "shared:bf16", "bf16/fp32@8"), num_docs=3,
                        prompt_len=40, tokens=150, segment_len=32, buckets="pow2", device="cpu",
                        output=str(tmp_path / "run"))
        return dataclasses.replace(base, **changes)

    return make

"""The generation tests' bundled models and a mocked out-of-memory step (they need no lm-eval: they run where it is
not installed)."""

import functools

import torch

from replayssm_eval.models import load_model

from tests.helpers.device import TEST_DEVICE


@functools.cache
def tiny_model(name: str, backend: str | None = None):
    """A bundled model in FP32 on the device under test, loaded once; backend: Triton on a GPU, torch on the CPU."""
    return load_model(name, dtype="fp32", device=TEST_DEVICE,
                      backend=backend or ("triton" if TEST_DEVICE == "cuda" else "torch"))


def out_of_memory_at_call(monkeypatch, engine, at: int) -> list[int]:
    """Make `engine.step_tokens` raise torch.OutOfMemoryError on its `at`-th call (1-based); returns the batch size
    of every call, filled as the engine runs."""
    step, calls = engine.step_tokens, []

    def flaky(session, tokens):
        calls.append(tokens.shape[0])
        if len(calls) == at:
            raise torch.OutOfMemoryError("CUDA out of memory (mocked)")
        return step(session, tokens)

    monkeypatch.setattr(engine, "step_tokens", flaky)
    return calls

"""Helpers of the tasks tests. The generation tests need no lm-eval (they run where it is not installed); the others skip without it."""

import os

import torch

TEST_DEVICE = os.environ.get("REPLAYSSM_TEST_DEVICE", "cpu")


def evaluate(lm, task_manager, names, **kwargs) -> dict:
    """lm-eval's simple_evaluate on tasks `names` with samples kept and no bootstrap."""
    import lm_eval

    return lm_eval.simple_evaluate(model=lm, tasks=list(names), task_manager=task_manager, log_samples=True,
                                   bootstrap_iters=0, **kwargs)


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

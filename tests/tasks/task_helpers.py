"""Helpers of the tasks tests. The generation tests need no lm-eval (they run where it is not installed); the others skip without it."""

import os

TEST_DEVICE = os.environ.get("REPLAYSSM_TEST_DEVICE", "cpu")


def evaluate(lm, task_manager, names, **kwargs) -> dict:
    """lm-eval's simple_evaluate on tasks `names` with samples kept and no bootstrap."""
    import lm_eval

    return lm_eval.simple_evaluate(model=lm, tasks=list(names), task_manager=task_manager, log_samples=True,
                                   bootstrap_iters=0, **kwargs)

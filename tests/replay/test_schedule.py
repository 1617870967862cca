import pytest
import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.schedule import ScheduleState, accepted_per_step, plan_tokens


def _plan(text, num_tokens, batch=1, state=None):
    config = ReplayConfig.parse(text)
    state = state or ScheduleState.start(batch)
    return plan_tokens(config, state, num_tokens, torch.arange(batch))


def test_window_flush_positions():
    plan, after = _plan("nvfp4/fp32@4", 10)
    assert plan.fold_after[0].nonzero().flatten().tolist() == [3, 7]
    assert torch.equal(plan.read_hi, plan.fold_after)
    assert plan.anchor[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert after.count.tolist() == [2]


def test_window_one_folds_every_token():
    plan, after = _plan("fp16", 5)
    assert plan.fold_after.all() and plan.read_hi.all()
    assert plan.anchor[0].tolist() == [0, 1, 2, 3, 4]


def test_window_phase_per_sequence():
    state = ScheduleState.start(2)
    state = ScheduleState(torch.tensor([0, 3]), state.step_left, state.step_read_hi, state.steps)
    plan, after = _plan("nvfp4/fp32@4", 6, batch=2, state=state)
    assert plan.fold_after[0].nonzero().flatten().tolist() == [3]
    assert plan.fold_after[1].nonzero().flatten().tolist() == [0, 4]
    assert after.count.tolist() == [2, 1]


@pytest.mark.parametrize("text", ["nvfp4/fp32@5", "nvfp4/fp32@4#spec=3:0.6", "nvfp4/fp32@2#spec=4:0.9"])
def test_split_calls_equal_one_call(text):
    whole, whole_after = _plan(text, 41, batch=3)
    first, mid = _plan(text, 17, batch=3)
    second, after = _plan(text, 24, batch=3, state=mid)
    assert torch.equal(torch.cat([first.fold_after, second.fold_after], 1), whole.fold_after)
    assert torch.equal(torch.cat([first.read_hi, second.read_hi], 1), whole.read_hi)
    for field in ("count", "step_left", "step_read_hi", "steps"):
        assert torch.equal(getattr(after, field), getattr(whole_after, field))


@pytest.mark.parametrize("drafts, accept, window", [(3, 0.7, 8), (2, 0.3, 4), (5, 1.0, 16), (4, 0.0, 3)])
def test_speculative_rule(drafts, accept, window):
    """Replay the plan step by step: a fold happens exactly when h + T > L after a step, and the next step reads S_hi."""
    config = ReplayConfig.parse(f"nvfp4/fp32@{window}#spec={drafts}:{accept}")
    plan, _ = plan_tokens(config, ScheduleState.start(1), 200, torch.tensor([11]))
    n, h, step, read_hi = 0, 0, 0, False
    while n < 200:
        committed = accepted_per_step(config.seed, 11, step, drafts, accept)
        assert 1 <= committed <= drafts
        end = min(n + committed, 200)
        assert plan.read_hi[0, n:end].tolist() == [read_hi] * (end - n)
        assert not plan.fold_after[0, n:end - 1].any()
        h += committed
        read_hi = h + drafts > window
        if end == n + committed:
            assert bool(plan.fold_after[0, end - 1]) == read_hi
        h = 0 if read_hi else h
        assert h <= window
        n, step = end, step + 1


def test_acceptance_draws_are_keyed():
    draws = [accepted_per_step(0, 3, s, 4, 0.6) for s in range(200)]
    assert draws == [accepted_per_step(0, 3, s, 4, 0.6) for s in range(200)]
    assert draws != [accepted_per_step(1, 3, s, 4, 0.6) for s in range(200)]
    mean = sum(draws) / len(draws)
    expected = sum(0.6**k for k in range(4))  # E[1 + leading successes of 3 draws]
    assert abs(mean - expected) < 0.2

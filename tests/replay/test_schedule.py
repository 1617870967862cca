import pytest
import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.host_values import host_copy, remember_host
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


def _longest_segment(fold_after: torch.Tensor, counts: list[int]) -> int:
    """Walk the tokens: the entries of each token's segment up to it, the largest over tokens and sequences."""
    longest = 0
    for count, folds in zip(counts, fold_after.tolist()):
        for fold in folds:
            count += 1
            longest = max(longest, count)
            count = 0 if fold else count
    return longest


@pytest.mark.parametrize("text", ["nvfp4/fp32@1", "nvfp4/fp32@2", "nvfp4/fp32@5", "nvfp4/fp32@16",
                                  "nvfp4/fp32@4#spec=3:0.6", "nvfp4/fp32@7#spec=4:0.9"])
@pytest.mark.parametrize("tokens", [0, 1, 6, 33])
def test_plan_shape_from_host_counts(text, tokens):
    """The host's segment geometry (no device read) equals the plan's: folds per sequence, the longest segment."""
    window = ReplayConfig.parse(text).window
    counts = [0, window - 1, window // 2, 2 * window + 1]  # the last one past the window: the formula's general case
    count = torch.tensor(counts)
    remember_host(count, counts)
    zeros = torch.zeros(4, dtype=torch.int64)
    plan, after = _plan(text, tokens, batch=4,
                        state=ScheduleState(count, zeros, torch.zeros(4, dtype=torch.bool), zeros.clone()))
    assert plan.shape is not None and plan.shape.counts == tuple(counts)
    assert list(plan.shape.num_folds) == plan.fold_after.sum(1).tolist()
    assert plan.shape.longest == _longest_segment(plan.fold_after, counts)
    assert host_copy(after.count) == after.count.tolist()
    second, _ = _plan(text, 5, batch=4, state=after)
    assert second.shape.longest == _longest_segment(second.fold_after, after.count.tolist())


def test_host_counts_only_while_the_tensor_is_unchanged():
    """A count tensor the host did not write, or written in place since, gives no host geometry."""
    state = ScheduleState.start(2)
    assert _plan("nvfp4/fp32@4", 3, batch=2, state=state)[0].shape is not None
    state.count.add_(1)
    plan, after = _plan("nvfp4/fp32@4", 3, batch=2, state=state)
    assert plan.shape is None and host_copy(after.count) is None
    assert plan.fold_after.sum(1).tolist() == [1, 1]
    fresh = ScheduleState(torch.tensor([1, 2]), state.step_left, state.step_read_hi, state.steps)
    assert _plan("nvfp4/fp32@4", 3, batch=2, state=fresh)[0].shape is None


@pytest.mark.parametrize("text", ["nvfp4/fp32@5", "nvfp4/fp32@4#spec=3:0.6"])
def test_plan_reads_nothing_back_when_the_host_knows_the_schedule(text):
    """Schedule and sequence ids on the meta device (no values to read back): the host's copies plan two calls,
    with the geometry of the same plans on the CPU."""
    config = ReplayConfig.parse(text)
    ids = torch.arange(3, device="meta")
    remember_host(ids, [0, 1, 2])
    plan, after = plan_tokens(config, ScheduleState.start(3, "meta"), 23, ids)
    second, _ = plan_tokens(config, after, 9, ids)
    cpu_plan, cpu_after = plan_tokens(config, ScheduleState.start(3), 23, torch.arange(3))
    cpu_second, _ = plan_tokens(config, cpu_after, 9, torch.arange(3))
    assert plan.fold_after.is_meta and second.shape is not None
    assert (plan.shape, second.shape) == (cpu_plan.shape, cpu_second.shape)

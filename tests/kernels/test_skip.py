"""`replay.skip.skipped_reads` marks exactly the (token, head) checkpoint reads the chunked kernels drop."""

import pytest
import torch

from replayssm_eval.kernels import gdn, mamba2
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.schedule import ScheduleState
from replayssm_eval.replay.skip import skipped_reads

from tests.helpers.delta import cut, delta_inputs
from tests.helpers.mamba2 import mamba2_inputs, sliced


def _changed(y_skip, y_full):
    """[B, T, H]: where skipping changed the output (any element of the head)."""
    return (y_skip != y_full).flatten(3).any(-1)


def _assert_same_until_fold(skipped, read_hi, changed):
    """Up to each sequence's first flush (included) only the skipped reads change outputs; after it the
    checkpoint itself differs where the fold dropped S_hi."""
    assert skipped.any() and not skipped.all()
    for b in range(skipped.shape[0]):
        end = int(read_hi[b].to(torch.int64).argmax()) + 1 if read_hi[b].any() else skipped.shape[1]
        assert torch.equal(skipped[b, :end], changed[b, :end]), b


@pytest.mark.parametrize("eps", [0.3, 0.6])
def test_mamba2_mask_is_the_kernels(eps):
    inputs = mamba2_inputs(batch=2, tokens=9, heads=3, head_dim=4, groups=1, d_state=5, dtype=torch.float32)
    x, dt, A, B, C, D, s0 = inputs
    cfg = ReplayConfig.parse("fp32/fp32@8")
    _, first = mamba2.chunked(*sliced(inputs, 0, 3)[:6], s0, cfg)  # carried entries and a phase
    rest = sliced(inputs, 3, 9)[:6]
    y_full, _ = mamba2.chunked(*rest, first, cfg)
    y_skip, _ = mamba2.chunked(*rest, first, cfg.replace(skip_read_below=eps))
    skipped, read_hi = skipped_reads(rest[1] * A, first.buffer["dt"] * A, first.schedule,
                                     cfg.replace(skip_read_below=eps), first.seq_ids)
    _assert_same_until_fold(skipped, read_hi, _changed(y_skip, y_full))


@pytest.mark.parametrize("eps", [0.3, 0.6])
def test_gdn_mask_is_the_kernels(eps):
    inputs = delta_inputs("gdn", batch=2, seqlen=9, heads=1, value_heads=2, dk=4, dv=3, dtype=torch.float32,
                          decay=1.0)
    cfg = ReplayConfig.parse("fp32/fp32@8")
    _, first = gdn.chunked(*cut(inputs, 0, 3), inputs[5], cfg)
    rest = cut(inputs, 3, 9)
    o_full, _ = gdn.chunked(*rest, first, cfg)
    o_skip, _ = gdn.chunked(*rest, first, cfg.replace(skip_read_below=eps))
    skipped, read_hi = skipped_reads(rest[3], first.buffer["g"], first.schedule, cfg.replace(skip_read_below=eps),
                                     first.seq_ids)
    _assert_same_until_fold(skipped, read_hi, _changed(o_skip, o_full))


def test_no_threshold_skips_nothing():
    log_decay = -torch.rand(2, 5, 3)
    skipped, _ = skipped_reads(log_decay, torch.zeros(2, 16, 3), ScheduleState.start(2, "cpu"),
                               ReplayConfig.parse("nvfp4/fp16sr"), torch.arange(2))
    assert not skipped.any()

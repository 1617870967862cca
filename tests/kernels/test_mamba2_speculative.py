"""Speculative decoding (ring of L + T, output-only verification, early flush) against non-speculative decoding."""

import pytest
import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.mamba2 import chunked, decode_reference, speculative_decode_reference

from tests.helpers.compare import assert_close, assert_same_state
from tests.helpers.mamba2 import mamba2_inputs, sliced


@pytest.mark.parametrize("text", ["nvfp4/fp16sr@8#spec=3:0.6", "shared:nvfp4@4#spec=2:0.5", "nvfp4/fp8sr@16#spec=5:0.8",
                                  "fp16/fp32@4#spec=1:0.5", "nvfp4/fp16sr@6#spec=4:0.3#seed=5#skip=0.2"])
def test_speculative_equals_plan_decoding(text):
    """FP64: committed outputs and checkpoints equal step decoding and the chunked form of the same plan."""
    config = ReplayConfig.parse(text)
    inputs = mamba2_inputs(batch=3, tokens=37, groups=1)
    y_spec, st_spec = speculative_decode_reference(*inputs, config, seq_ids=[2, 7, 8], compute_dtype=torch.float64)
    y_ref, st_ref = decode_reference(*inputs, config, seq_ids=[2, 7, 8], compute_dtype=torch.float64)
    y_chk, st_chk = chunked(*inputs, config, seq_ids=[2, 7, 8], compute_dtype=torch.float64)
    assert st_ref.checkpoint.min() >= 2, "the plan must flush"
    assert_close("y spec vs reference", y_ref, y_spec, 1e-12)
    assert_close("y chunked vs reference", y_ref, y_chk, 1e-12)
    assert_same_state(st_ref, st_spec)
    assert_same_state(st_ref, st_chk)


def test_speculative_split_calls_and_rejected_drafts():
    """A call may end inside a step; the junk written for rejected drafts never reaches a committed output."""
    text = "nvfp4/fp16sr@8#spec=3:0.7"
    inputs = mamba2_inputs(batch=2, tokens=30)
    y_all, st_all = speculative_decode_reference(*inputs, text, compute_dtype=torch.float64)
    y_a, st = speculative_decode_reference(*sliced(inputs, 0, 13), text, compute_dtype=torch.float64, draft_seed=1)
    assert st.schedule.step_left.any(), "the first call should end inside a step"
    y_b, st = speculative_decode_reference(*sliced(inputs, 13, 30)[:6], st, text, compute_dtype=torch.float64,
                                           draft_seed=2)
    assert_close("y", y_all, torch.cat([y_a, y_b], 1), 1e-12)
    assert_same_state(st_all, st)
    y_other, _ = speculative_decode_reference(*inputs, text, compute_dtype=torch.float64, draft_seed=9)
    assert torch.equal(y_all, y_other)


@pytest.mark.parametrize("drafts, accept, window", [(1, 0.5, 4), (2, 0.4, 5), (3, 0.9, 8), (4, 0.6, 16)])
def test_speculative_fp32_state_equals_eager(drafts, accept, window):
    """With an FP32 state the flush schedule changes no number beyond FP32 round-off: spec == conventional decoding."""
    inputs = mamba2_inputs(batch=2, tokens=29, groups=1, dtype=torch.float32)
    y_eager, st_eager = decode_reference(*inputs, "fp32")
    y_spec, st_spec = speculative_decode_reference(*inputs, f"shared:fp32@{window}#spec={drafts}:{accept}")
    assert_close("y", y_eager, y_spec, 1e-6)
    # the speculative state is its newest checkpoint plus the buffered entries: fold them to compare
    A = inputs[2]
    count = st_spec.schedule.count
    for b in range(2):
        S = st_spec.hi[b].double()
        for i in range(int(count[b])):
            bx, bB, bdt = (st_spec.buffer[k][b, i].double() for k in ("x", "B", "dt"))
            S = torch.exp(bdt * A.double())[:, None, None] * S + (bdt[:, None] * bx)[..., None] * bB.repeat_interleave(3, 0)[:, None]
        assert_close(f"state[{b}]", st_eager.hi[b], S, 1e-6)

"""The chunked (teacher-forced) Mamba-2 path against the step reference, and continuation across calls."""

import dataclasses
import importlib

import pytest
import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.mamba2 import chunked, decode_reference
from replayssm_eval.kernels.mamba2._common import prepare_inputs
from replayssm_eval.kernels.mamba2.chunked import Segments
from replayssm_eval.replay.host_values import remember_host
from replayssm_eval.replay.schedule import plan_tokens

from tests.helpers.compare import assert_close, assert_same_state
from tests.helpers.mamba2 import mamba2_inputs, phased_state, sliced
from tests.helpers.replay import CONFIGS, WINDOWS


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("text", CONFIGS)
def test_chunked_matches_reference_fp64(text, window):
    """Sequences at different phases: FP64 gives the same rounding decisions, so identical checkpoints."""
    config = ReplayConfig.parse(f"{text}@{window}")
    inputs = mamba2_inputs()
    state = phased_state(decode_reference, inputs, config, [0, 5, 11])
    main = sliced(inputs, 11, 37)[:6]
    y_ref, st_ref = decode_reference(*main, state, config, compute_dtype=torch.float64)
    y, st = chunked(*main, state, config, compute_dtype=torch.float64)
    assert_close("y", y_ref, y, 1e-12)
    assert_same_state(st_ref, st)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("text", CONFIGS)
def test_chunked_matches_reference_fp32(text, window):
    """FP32: 1e-5 relative; quantized formats may flip a rare rounding decision (see assert_close)."""
    config = ReplayConfig.parse(f"{text}@{window}")
    inputs = mamba2_inputs(dtype=torch.float32, seed=1)
    y_ref, st_ref = decode_reference(*inputs, config)
    y, st = chunked(*inputs, config)
    flips = 0.0 if config.is_reference else 0.01
    assert_close("y", y_ref, y, 1e-5, flips=flips)
    assert_same_state(st_ref, st, rtol=1e-5, flips=flips)


@pytest.mark.parametrize("text", ["nvfp4/fp16sr@4", "shared:nvfp4@16", "fp16sr@1", "nvfp4/fp8sr@4#skip=0.3"])
def test_continuation_across_calls(text):
    """chunked 20 -> reference 9 -> chunked 8 equals reference 37, and the other way round."""
    inputs = mamba2_inputs(groups=1)
    y_all, st_all = decode_reference(*inputs, text, compute_dtype=torch.float64)
    for fns in ((chunked, decode_reference, chunked), (decode_reference, chunked, decode_reference)):
        state, ys = inputs[6], []
        for fn, (start, stop) in zip(fns, ((0, 20), (20, 29), (29, 37))):
            y, state = fn(*sliced(inputs, start, stop)[:6], state, text, compute_dtype=torch.float64)
            ys.append(y)
        assert_close("y", y_all, torch.cat(ys, 1), 1e-12)
        assert_same_state(st_all, state)


def test_chunked_empty_call_and_long_block_loop(monkeypatch):
    """T = 0 returns the state unchanged; a tiny block size exercises the per-block state passing."""
    mod = importlib.import_module("replayssm_eval.kernels.mamba2.chunked")  # the package attribute is the function
    inputs = mamba2_inputs(batch=2, tokens=23)
    y_ref, st_ref = decode_reference(*inputs, "nvfp4/fp16sr@3", compute_dtype=torch.float64)
    monkeypatch.setattr(mod, "_BLOCK_ELEMENTS", 1)
    y, st = chunked(*inputs, "nvfp4/fp16sr@3", compute_dtype=torch.float64)
    assert_close("y", y_ref, y, 1e-12)
    assert_same_state(st_ref, st)
    y0, st0 = chunked(*sliced(inputs, 0, 0)[:6], st, "nvfp4/fp16sr@3", compute_dtype=torch.float64)
    assert y0.shape == (2, 0, 3, 20)
    assert_same_state(st, st0)


@pytest.mark.parametrize("text", ["nvfp4/fp16sr@4", "fp16sr@1", "nvfp4/fp16sr@16", "nvfp4/fp16sr@5#spec=3:0.6"])
@pytest.mark.parametrize("tokens", [0, 9, 26])
def test_segments_from_host_counts(text, tokens):
    """The segment grid from the host's schedule counts (no device read) equals the one read from the device."""
    config = ReplayConfig.parse(text)
    inputs = mamba2_inputs()
    state = phased_state(decode_reference, inputs, config, [0, 5, 11])
    remember_host(state.schedule.count, state.schedule.count.tolist())
    inp = prepare_inputs(*sliced(inputs, 11, 11 + tokens)[:6], state, config, 0, None, torch.float64)
    plan, _ = plan_tokens(inp.config, inp.state.schedule, tokens, inp.state.seq_ids)
    assert plan.shape is not None
    host, device = Segments(inp, plan), Segments(inp, dataclasses.replace(plan, shape=None))
    assert (host.length, host.segments, host.folds_host) == (device.length, device.segments, device.folds_host)
    assert torch.equal(host.index, device.index)

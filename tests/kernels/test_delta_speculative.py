"""Speculative delta-rule decoding, GDN and KDA (ring of L + T, output-only verification, pointer commit, early flush)
against non-speculative decoding of the same tokens."""

import pytest
import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.delta._common import buffer_capacity

from tests.helpers.compare import assert_close
from tests.helpers.delta import FAMILIES, cut, delta_inputs, phased_start, plain_recurrence

FAM = pytest.mark.parametrize("fam", list(FAMILIES))


def _same_state(ref, got):
    assert torch.equal(ref.hi, got.hi) and torch.equal(ref.lo, got.lo)
    assert torch.equal(ref.checkpoint, got.checkpoint)
    for field in ("count", "step_left", "step_read_hi", "steps"):
        assert torch.equal(getattr(ref.schedule, field), getattr(got.schedule, field)), field
    for name in ref.buffer:
        assert_close(f"buffer[{name!r}]", ref.buffer[name], got.buffer[name], 1e-12)


@FAM
@pytest.mark.parametrize("fold", ["open", "closed"])
@pytest.mark.parametrize("text", [
    "nvfp4/fp16sr@8#spec=2:0.5", "nvfp4/fp8sr@8#spec=3:0.7", "shared:nvfp4@6#spec=4:0.8", "nvfp4/fp32@16#spec=5:0.6#skip=0.3",
])
def test_speculative_equals_step_reference(fam, text, fold):
    """Random acceptance, per-sequence step positions: committed outputs and states equal decode_reference's (fp64)."""
    mod = FAMILIES[fam]
    cfg = ReplayConfig.parse(text).replace(gdn_fold=fold)
    inputs = delta_inputs(fam, seqlen=25)
    start = phased_start(fam, inputs, cfg, warmup=(0, 3, 4))  # also leaves some steps cut mid-way
    o_ref, st_ref = mod.decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    o, st = mod.speculative_decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    assert_close("committed o", o_ref, o, 1e-12)
    _same_state(st_ref, st)
    assert st.buffer["k"].shape[1] == buffer_capacity(cfg) == cfg.window + cfg.speculative.drafts


@FAM
def test_speculative_fp32_compute(fam):
    mod = FAMILIES[fam]
    cfg = "nvfp4/fp16sr@8#spec=3:0.6#closed"
    inputs = delta_inputs(fam, seqlen=30, dtype=torch.float32)
    o_ref, _ = mod.decode_reference(*inputs, cfg)
    o, _ = mod.speculative_decode_reference(*inputs, cfg)
    assert_close("committed o", o_ref, o, 1e-6)


@FAM
@pytest.mark.parametrize("drafts", [1, 2, 4, 7])
def test_fp32_speculative_equals_plain_decoding(fam, drafts):
    """FP32 formats: speculative decoding reproduces the plain recurrence (non-speculative decoding)."""
    inputs = delta_inputs(fam, seqlen=33, dtype=torch.float32)
    want, _ = plain_recurrence(inputs)
    o, _ = FAMILIES[fam].speculative_decode_reference(*inputs, f"fp32/fp32@8#spec={drafts}:0.7")
    assert_close("o", want, o, 1e-5)


@FAM
def test_speculative_split_calls(fam):
    """A call may end inside a step; the next call finishes it."""
    speculative = FAMILIES[fam].speculative_decode_reference
    cfg = "nvfp4/fp8sr@6#spec=3:0.8#closed"
    inputs = delta_inputs(fam, seqlen=30)
    o, st = speculative(*inputs, cfg, compute_dtype=torch.float64)
    parts, state = [], inputs[5]
    for a, b in ((0, 7), (7, 8), (8, 19), (19, 30)):
        o_part, state = speculative(*cut(inputs, a, b), state, cfg, compute_dtype=torch.float64)
        parts.append(o_part)
    assert_close("o", o, torch.cat(parts, 1), 1e-12)
    _same_state(st, state)


@FAM
def test_rejected_drafts_do_not_leak(fam):
    """Acceptance changes which drafts are verified, never the committed outputs."""
    mod = FAMILIES[fam]
    inputs = delta_inputs(fam, seqlen=24)
    always, _ = mod.speculative_decode_reference(*inputs, "nvfp4/fp16sr@8#spec=4:1", compute_dtype=torch.float64)
    never, _ = mod.speculative_decode_reference(*inputs, "nvfp4/fp16sr@8#spec=4:0", compute_dtype=torch.float64)
    o_ref, _ = mod.decode_reference(*inputs, "nvfp4/fp16sr@8#spec=4:1", compute_dtype=torch.float64)
    assert_close("accept all", o_ref, always, 1e-12)
    # a different acceptance process gives a different flush schedule, hence different (but valid) numbers
    assert (always - never).abs().max() > 0


@FAM
def test_requires_speculative_config(fam):
    inputs = delta_inputs(fam, batch=1, seqlen=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="has no speculative schedule; expected one with #spec=T:alpha"):
        FAMILIES[fam].speculative_decode_reference(*inputs, "nvfp4/fp32@8")

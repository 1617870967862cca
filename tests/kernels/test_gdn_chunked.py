"""The chunked (teacher-forced) GDN form against the step reference: fp64 identical checkpoints, fp32 to 1e-5."""

import importlib

import pytest
import torch
from test_gdn_reference import CONFIGS, MATRIX, assert_close, cut, make_inputs, phased_start

from replayssm_eval.kernels.config import ReplayConfig
from replayssm_eval.kernels.gdn import chunked, decode_reference

SPECULATIVE = ["nvfp4/fp16sr@8#spec=3:0.6", "shared:nvfp4@5#spec=2:0.5", "nvfp4/fp8sr@4#spec=4:0.9"]


def assert_same_state(ref, got, exact=True, rtol=1e-5):
    for name in ("hi", "lo"):
        if exact:
            assert torch.equal(getattr(ref, name), getattr(got, name)), f"S_{name} differs"
        else:
            assert_close(f"S_{name}", getattr(ref, name), getattr(got, name), rtol)
    for name in ref.buffer:
        assert_close(f"buffer[{name!r}]", ref.buffer[name], got.buffer[name], 1e-12 if exact else rtol)
    assert torch.equal(ref.checkpoint, got.checkpoint)
    for field in ("count", "step_left", "step_read_hi", "steps"):
        assert torch.equal(getattr(ref.schedule, field), getattr(got.schedule, field)), field


@pytest.mark.parametrize("window, fold", MATRIX)
@pytest.mark.parametrize("text", CONFIGS + ["nvfp4/fp16sr#skip=0.6"])
def test_chunked_matches_reference_fp64(text, window, fold):
    """Per-sequence phases (a continued, stacked state), fp64: outputs to 1e-10 and the very same checkpoints."""
    inputs = make_inputs(seqlen=11 if window == 1 else 23)
    cfg = ReplayConfig.parse(text).replace(window=window, gdn_fold=fold)
    start = phased_start(inputs, cfg)
    o_ref, st_ref = decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    o, st = chunked(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    assert_close("o", o_ref, o, 1e-10)
    assert_same_state(st_ref, st)


@pytest.mark.parametrize("fold", ["open", "closed"])
@pytest.mark.parametrize("text", SPECULATIVE + ["nvfp4/fp16sr@6#spec=3:0.7#skip=0.5"])
def test_chunked_speculative_plans_fp64(text, fold):
    inputs = make_inputs(seqlen=31)
    cfg = ReplayConfig.parse(text).replace(gdn_fold=fold)
    start = phased_start(inputs, cfg, warmup=(0, 2, 5))
    o_ref, st_ref = decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    o, st = chunked(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    assert_close("o", o_ref, o, 1e-10)
    assert_same_state(st_ref, st)


@pytest.mark.parametrize("text", ["fp32", "fp32/fp32@4", "fp32/fp32@16#closed", "fp32/fp32@5#spec=3:0.6#closed", "fp32/fp32@7#skip=0.4"])
def test_chunked_matches_reference_fp32(text):
    """FP32 compute: the two paths round differently, so only FP32 formats (no grid to flip across) compare tightly."""
    inputs = make_inputs(seqlen=37, dtype=torch.float32)
    start = phased_start(inputs, text, dtype=torch.float32)
    o_ref, st_ref = decode_reference(*cut(inputs, 0), start, text)
    o, st = chunked(*cut(inputs, 0), start, text)
    assert_close("o", o_ref, o, 1e-5)
    assert_same_state(st_ref, st, exact=False)


@pytest.mark.parametrize("text", ["nvfp4/fp16sr@16", "nvfp4/fp8sr@16#closed", "nvfp4/fp16sr@6#spec=3:0.6#closed"])
def test_continuation_across_backends(text):
    """chunked for 100 tokens then decode_reference for 37 == decode_reference for 137, and the other way round."""
    inputs = make_inputs(batch=2, seqlen=137, heads=1, value_heads=2, dk=16, dv=8)
    o_all, st_all = decode_reference(*inputs, text, compute_dtype=torch.float64)
    o1, mid = chunked(*cut(inputs, 0, 100), inputs[5], text, compute_dtype=torch.float64)
    o2, end = decode_reference(*cut(inputs, 100), mid, text, compute_dtype=torch.float64)
    assert_close("o (chunked, reference)", o_all, torch.cat([o1, o2], 1), 1e-10)
    assert_same_state(st_all, end)
    o1, mid = decode_reference(*cut(inputs, 0, 41), inputs[5], text, compute_dtype=torch.float64)
    o2, mid = chunked(*cut(inputs, 41, 90), mid, text, compute_dtype=torch.float64)
    o3, end = chunked(*cut(inputs, 90), mid, text, compute_dtype=torch.float64)
    assert_close("o (reference, chunked, chunked)", o_all, torch.cat([o1, o2, o3], 1), 1e-10)
    assert_same_state(st_all, end)


def test_chunked_long_sequence_blocks(monkeypatch):
    """Many segments processed in several precompute blocks give the one-block result."""
    mod = importlib.import_module("replayssm_eval.kernels.gdn.chunked")  # the package re-exports the function under this name

    inputs = make_inputs(batch=2, seqlen=70, heads=1, value_heads=2, dk=8, dv=8)
    text = "nvfp4/fp16sr@4#closed"
    o_one, st_one = chunked(*inputs, text, compute_dtype=torch.float64)
    monkeypatch.setattr(mod, "_BLOCK_ELEMENTS", 1)
    o_many, st_many = chunked(*inputs, text, compute_dtype=torch.float64)
    assert torch.equal(o_one, o_many)
    assert_same_state(st_one, st_many)


def test_empty_call_keeps_state():
    inputs = make_inputs(batch=2, seqlen=6)
    _, st = chunked(*inputs, "nvfp4/fp32@4", compute_dtype=torch.float64)
    o, same = chunked(*cut(inputs, 0, 0), st, "nvfp4/fp32@4", compute_dtype=torch.float64)
    assert o.shape == (2, 0, 4, 24)
    assert_same_state(st, same)


def test_bad_backend():
    inputs = make_inputs(batch=1, seqlen=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="unknown backend 'cuda'; expected one of torch, triton"):
        chunked(*inputs, "fp32", backend="cuda")


@pytest.mark.parametrize("fold", ["open", "closed"])
def test_beta_up_to_two(fold):
    """Layers with allow_neg_eigval (olmo_hybrid) pass beta in (0, 2): nothing clamps it.

    The reference equals the naive recurrence, the chunked form the reference (fp64), and the Triton chunked kernel
    the torch one (fp32) for a split config."""
    from test_gdn_reference import naive_decode

    from replayssm_eval.kernels.gdn import checkpoint_kv

    inputs = make_inputs(seqlen=19)
    inputs[4] = 2 * inputs[4]
    assert inputs[4].max() > 1.5
    cfg = ReplayConfig.parse("nvfp4/fp16sr@4").replace(gdn_fold=fold)
    o_ref, st_ref = decode_reference(*cut(inputs, 0), inputs[5], cfg, compute_dtype=torch.float64)
    for b in range(inputs[0].shape[0]):
        want, want_hi, _ = naive_decode([t[b] for t in inputs], cfg, b)
        assert_close(f"o[{b}]", want, o_ref[b], 1e-10)
        assert torch.equal(want_hi.float(), checkpoint_kv(st_ref)[0][b])
    o, st = chunked(*cut(inputs, 0), inputs[5], cfg, compute_dtype=torch.float64)
    assert_close("o", o_ref, o, 1e-10)
    assert_same_state(st_ref, st)
    fp32 = [t.float() for t in inputs]
    o_torch, _ = chunked(*cut(fp32, 0), fp32[5], cfg)
    o_triton, _ = chunked(*cut(fp32, 0), fp32[5], cfg, backend="triton")
    assert_close("o triton", o_torch, o_triton, 1e-4)

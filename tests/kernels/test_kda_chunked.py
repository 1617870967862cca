"""The chunked (teacher-forced) KDA form against the step reference: fp64 identical checkpoints, fp32 to 1e-5."""

import importlib

import pytest
import torch
from test_kda_reference import CONFIGS, MATRIX, assert_close, cut, make_inputs, phased_start

from replayssm_eval.kernels.config import ReplayConfig
from replayssm_eval.kernels.kda import checkpoint_kv, chunked, decode_reference

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
    inputs = make_inputs(seqlen=11 if window == 1 else 21)
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
    """chunked for 50 tokens then decode_reference for 27 == decode_reference for 77, and the other way round."""
    inputs = make_inputs(batch=2, seqlen=77, heads=1, value_heads=2, dk=16, dv=8)
    o_all, st_all = decode_reference(*inputs, text, compute_dtype=torch.float64)
    o1, mid = chunked(*cut(inputs, 0, 50), inputs[5], text, compute_dtype=torch.float64)
    o2, end = decode_reference(*cut(inputs, 50), mid, text, compute_dtype=torch.float64)
    assert_close("o (chunked, reference)", o_all, torch.cat([o1, o2], 1), 1e-10)
    assert_same_state(st_all, end)
    o1, mid = decode_reference(*cut(inputs, 0, 21), inputs[5], text, compute_dtype=torch.float64)
    o2, mid = chunked(*cut(inputs, 21, 60), mid, text, compute_dtype=torch.float64)
    o3, end = chunked(*cut(inputs, 60), mid, text, compute_dtype=torch.float64)
    assert_close("o (reference, chunked, chunked)", o_all, torch.cat([o1, o2, o3], 1), 1e-10)
    assert_same_state(st_all, end)


def test_chunked_long_sequence_blocks(monkeypatch):
    """Many segments processed in several precompute blocks give the one-block result."""
    mod = importlib.import_module("replayssm_eval.kernels.kda.chunked")  # the package re-exports the function under this name

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
    assert o.shape == (2, 0, 4, 12)
    assert_same_state(st, same)


def test_bad_backend():
    inputs = make_inputs(batch=1, seqlen=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="unknown backend 'cuda'; expected one of torch, triton"):
        chunked(*inputs, "fp32", backend="cuda")


def test_fp32_chunked_matches_hf_chunk_kernel():
    """The FP32 config equals transformers' `chunk_kimi_delta_attention` on raw q, k (it normalises and scales)."""
    hf = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    gen = torch.Generator().manual_seed(5)
    q_raw, k_raw = torch.randn(2, 45, 2, 16, generator=gen), torch.randn(2, 45, 2, 16, generator=gen)
    v = torch.randn(2, 45, 2, 8, generator=gen)
    g = -torch.rand(2, 45, 2, 16, generator=gen) * 0.3
    beta = torch.rand(2, 45, 2, generator=gen)
    s0 = torch.randn(2, 2, 16, 8, generator=gen)
    chunk = getattr(hf.chunk_kimi_delta_attention, "__wrapped__", hf.chunk_kimi_delta_attention)
    want, want_state = chunk(q_raw, k_raw, v, g, beta, chunk_size=16, initial_state=s0, output_final_state=True,
                             use_qk_l2norm_in_kernel=True)
    q, k = hf.l2norm(q_raw) * 16**-0.5, hf.l2norm(k_raw)
    o, st = chunked(q, k, v, g, beta, s0, "fp32/fp32@9")
    assert_close("o", want, o, 1e-5)
    _, st = chunked(q, k, v, g, beta, s0, "fp32/fp32@15")  # 45 = 3 windows: the last checkpoint is the final state
    assert_close("state", want_state, checkpoint_kv(st)[0], 1e-5)


def test_strong_decay_stays_finite():
    """Channels decaying by e^-40 per token: the pairwise decays are formed per channel, nothing overflows."""
    q, k, v, g, beta, s0 = make_inputs(batch=2, seqlen=20, dtype=torch.float32)
    g = g.clone()
    g[..., ::3] = -40.0
    o_ref, st_ref = decode_reference(q, k, v, g, beta, s0, "fp32/fp32@16#closed")
    o, st = chunked(q, k, v, g, beta, s0, "fp32/fp32@16#closed")
    assert torch.isfinite(o).all()
    assert_close("o", o_ref, o, 1e-5)
    assert_same_state(st_ref, st, exact=False)

"""The chunked (teacher-forced) delta-rule form, GDN and KDA, against the step reference: fp64 identical checkpoints,
fp32 to 1e-5."""

import dataclasses

import pytest
import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.delta import chunked as chunked_module
from replayssm_eval.kernels.delta._common import checkpoint_kv
from replayssm_eval.replay.host_values import remember_host

from tests.helpers.compare import assert_close, assert_same_state
from tests.helpers.delta import (FAMILIES, MATRIX, cut, delta_inputs, naive_delta_decode, one_column_share,
                                 phased_start, square_kda_inputs)
from tests.helpers.device import TEST_DEVICE
from tests.helpers.replay import CONFIGS

SPECULATIVE = ["nvfp4/fp16sr@8#spec=3:0.6", "shared:nvfp4@5#spec=2:0.5", "nvfp4/fp8sr@4#spec=4:0.9"]
FAM = pytest.mark.parametrize("fam", list(FAMILIES))


@FAM
@pytest.mark.parametrize("window, fold", MATRIX)
@pytest.mark.parametrize("text", CONFIGS + ["nvfp4/fp16sr#skip=0.6"])
def test_chunked_matches_reference_fp64(fam, text, window, fold):
    """Per-sequence phases (a continued, stacked state), fp64: outputs to 1e-10 and the very same checkpoints."""
    mod = FAMILIES[fam]
    inputs = delta_inputs(fam, seqlen=11 if window == 1 else 21)
    cfg = ReplayConfig.parse(text).replace(window=window, gdn_fold=fold)
    start = phased_start(fam, inputs, cfg)
    o_ref, st_ref = mod.decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    o, st = mod.chunked(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    assert_close("o", o_ref, o, 1e-10)
    assert_same_state(st_ref, st, buffer_rtol=1e-12, whole_buffer=True)


@FAM
@pytest.mark.parametrize("fold", ["open", "closed"])
@pytest.mark.parametrize("text", SPECULATIVE + ["nvfp4/fp16sr@6#spec=3:0.7#skip=0.5"])
def test_chunked_speculative_plans_fp64(fam, text, fold):
    mod = FAMILIES[fam]
    inputs = delta_inputs(fam, seqlen=31)
    cfg = ReplayConfig.parse(text).replace(gdn_fold=fold)
    start = phased_start(fam, inputs, cfg, warmup=(0, 2, 5))
    o_ref, st_ref = mod.decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    o, st = mod.chunked(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    assert_close("o", o_ref, o, 1e-10)
    assert_same_state(st_ref, st, buffer_rtol=1e-12, whole_buffer=True)


@FAM
@pytest.mark.parametrize("text", ["fp32", "fp32/fp32@4", "fp32/fp32@16#closed", "fp32/fp32@5#spec=3:0.6#closed", "fp32/fp32@7#skip=0.4"])
def test_chunked_matches_reference_fp32(fam, text):
    """FP32 compute: the two paths round differently, so only FP32 formats (no grid to flip across) compare tightly."""
    mod = FAMILIES[fam]
    inputs = delta_inputs(fam, seqlen=37, dtype=torch.float32)
    start = phased_start(fam, inputs, text, dtype=torch.float32)
    o_ref, st_ref = mod.decode_reference(*cut(inputs, 0), start, text)
    o, st = mod.chunked(*cut(inputs, 0), start, text)
    assert_close("o", o_ref, o, 1e-5)
    assert_same_state(st_ref, st, rtol=1e-5, buffer_rtol=1e-5, whole_buffer=True)


@FAM
@pytest.mark.parametrize("text", ["nvfp4/fp16sr@16", "nvfp4/fp8sr@16#closed", "nvfp4/fp16sr@6#spec=3:0.6#closed"])
def test_continuation_across_backends(fam, text):
    """chunked for 50 tokens then decode_reference for 27 == decode_reference for 77, and the other way round."""
    mod = FAMILIES[fam]
    inputs = delta_inputs(fam, batch=2, seqlen=77, heads=1, value_heads=2, dk=16, dv=8)
    o_all, st_all = mod.decode_reference(*inputs, text, compute_dtype=torch.float64)
    o1, mid = mod.chunked(*cut(inputs, 0, 50), inputs[5], text, compute_dtype=torch.float64)
    o2, end = mod.decode_reference(*cut(inputs, 50), mid, text, compute_dtype=torch.float64)
    assert_close("o (chunked, reference)", o_all, torch.cat([o1, o2], 1), 1e-10)
    assert_same_state(st_all, end, buffer_rtol=1e-12, whole_buffer=True)
    o1, mid = mod.decode_reference(*cut(inputs, 0, 21), inputs[5], text, compute_dtype=torch.float64)
    o2, mid = mod.chunked(*cut(inputs, 21, 60), mid, text, compute_dtype=torch.float64)
    o3, end = mod.chunked(*cut(inputs, 60), mid, text, compute_dtype=torch.float64)
    assert_close("o (reference, chunked, chunked)", o_all, torch.cat([o1, o2, o3], 1), 1e-10)
    assert_same_state(st_all, end, buffer_rtol=1e-12, whole_buffer=True)


@FAM
def test_chunked_long_sequence_blocks(fam, monkeypatch):
    """Many segments processed in several precompute blocks give the one-block result."""
    chunked = FAMILIES[fam].chunked
    inputs = delta_inputs(fam, batch=2, seqlen=70, heads=1, value_heads=2, dk=8, dv=8)
    text = "nvfp4/fp16sr@4#closed"
    o_one, st_one = chunked(*inputs, text, compute_dtype=torch.float64)
    monkeypatch.setattr(chunked_module, "BLOCK_ELEMENTS", 1)
    o_many, st_many = chunked(*inputs, text, compute_dtype=torch.float64)
    assert torch.equal(o_one, o_many)
    assert_same_state(st_one, st_many, buffer_rtol=1e-12, whole_buffer=True)


@FAM
def test_empty_call_keeps_state(fam):
    chunked = FAMILIES[fam].chunked
    inputs = delta_inputs(fam, batch=2, seqlen=6)
    _, st = chunked(*inputs, "nvfp4/fp32@4", compute_dtype=torch.float64)
    o, same = chunked(*cut(inputs, 0, 0), st, "nvfp4/fp32@4", compute_dtype=torch.float64)
    assert o.shape == (2, 0, 4, inputs[2].shape[-1])
    assert_same_state(st, same, buffer_rtol=1e-12, whole_buffer=True)


@FAM
def test_bad_backend(fam):
    inputs = delta_inputs(fam, batch=1, seqlen=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="unknown backend 'cuda'; expected one of torch, triton"):
        FAMILIES[fam].chunked(*inputs, "fp32", backend="cuda")


@pytest.mark.parametrize("fold", ["open", "closed"])
def test_gdn_beta_up_to_two(fold):
    """Layers with allow_neg_eigval (olmo_hybrid) pass beta in (0, 2): nothing clamps it.

    The reference equals the naive recurrence, the chunked form the reference (fp64), and the Triton chunked kernel
    the torch one (fp32) for a split config, up to the roundings FP32 noise flips (`one_column_share`)."""
    gdn = FAMILIES["gdn"]
    inputs = delta_inputs("gdn", seqlen=19)
    inputs[4] = 2 * inputs[4]
    assert inputs[4].max() > 1.5
    cfg = ReplayConfig.parse("nvfp4/fp16sr@4").replace(gdn_fold=fold)
    check_naive_reference_chunked_fp64("gdn", inputs, cfg)
    fp32 = [t.float().to(TEST_DEVICE) for t in inputs]
    o_torch, _ = gdn.chunked(*cut(fp32, 0), fp32[5], cfg)
    o_triton, _ = gdn.chunked(*cut(fp32, 0), fp32[5], cfg, backend="triton")
    assert_close("o triton", o_torch, o_triton, 1e-5, flips=one_column_share(fp32))


@pytest.mark.parametrize("text", ["fp32/fp32@4", "nvfp4/fp16sr@4", "nvfp4/fp8sr@5#closed"])
def test_kda_square_heads_with_unequal_channel_decays_fp64(text):
    """K = V: the reference equals the naive recurrence (each decay scales its K row of S [K, V]) and the chunked
    form the reference; a decay along the wrong axis would run and fail these comparisons."""
    check_naive_reference_chunked_fp64("kda", square_kda_inputs(seqlen=13), text)


def check_naive_reference_chunked_fp64(fam, inputs, config):
    """decode_reference == the naive recurrence per row (outputs to 1e-10, S_hi bit for bit), chunked == the
    reference (fp64)."""
    mod = FAMILIES[fam]
    o_ref, st_ref = mod.decode_reference(*cut(inputs, 0), inputs[5], config, compute_dtype=torch.float64)
    for b in range(inputs[0].shape[0]):
        want, want_hi, _ = naive_delta_decode([t[b] for t in inputs], config, b)
        assert_close(f"o[{b}]", want, o_ref[b], 1e-10)
        assert torch.equal(want_hi.float(), checkpoint_kv(st_ref)[0][b])
    o, st = mod.chunked(*cut(inputs, 0), inputs[5], config, compute_dtype=torch.float64)
    assert_close("o", o_ref, o, 1e-10)
    assert_same_state(st_ref, st, buffer_rtol=1e-12, whole_buffer=True)


@pytest.mark.parametrize("dv", [8, 16])  # 16: K = V
def test_kda_fp32_chunked_matches_hf_chunk_kernel(dv):
    """The FP32 config equals transformers' `chunk_kimi_delta_attention` on raw q, k (it normalises and scales)."""
    hf = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    kda = FAMILIES["kda"]
    gen = torch.Generator().manual_seed(5)
    q_raw, k_raw = torch.randn(2, 45, 2, 16, generator=gen), torch.randn(2, 45, 2, 16, generator=gen)
    v = torch.randn(2, 45, 2, dv, generator=gen)
    g = -torch.rand(2, 45, 2, 16, generator=gen) * torch.linspace(0.05, 2, 16)  # unequal channel decays
    beta = torch.rand(2, 45, 2, generator=gen)
    s0 = torch.randn(2, 2, 16, dv, generator=gen)
    chunk = getattr(hf.chunk_kimi_delta_attention, "__wrapped__", hf.chunk_kimi_delta_attention)
    want, want_state = chunk(q_raw, k_raw, v, g, beta, chunk_size=16, initial_state=s0, output_final_state=True,
                             use_qk_l2norm_in_kernel=True)
    q, k = hf.l2norm(q_raw) * 16**-0.5, hf.l2norm(k_raw)
    o, st = kda.chunked(q, k, v, g, beta, s0, "fp32/fp32@9")
    assert_close("o", want, o, 1e-5)
    _, st = kda.chunked(q, k, v, g, beta, s0, "fp32/fp32@15")  # 45 = 3 windows: the last checkpoint is the final state
    assert_close("state", want_state, checkpoint_kv(st)[0], 1e-5)


def test_kda_strong_decay_stays_finite():
    """Channels decaying by e^-40 per token: the pairwise decays are formed per channel, nothing overflows."""
    kda = FAMILIES["kda"]
    q, k, v, g, beta, s0 = delta_inputs("kda", batch=2, seqlen=20, dtype=torch.float32)
    g = g.clone()
    g[..., ::3] = -40.0
    o_ref, st_ref = kda.decode_reference(q, k, v, g, beta, s0, "fp32/fp32@16#closed")
    o, st = kda.chunked(q, k, v, g, beta, s0, "fp32/fp32@16#closed")
    assert torch.isfinite(o).all()
    assert_close("o", o_ref, o, 1e-5)
    assert_same_state(st_ref, st, rtol=1e-5, buffer_rtol=1e-5, whole_buffer=True)


def test_pad_segments_places_tokens_and_carried_entries():
    """`pad_segments` (one gather) == scattering the tokens to `tok_index` and the carried entries to `pre_index` of
    a zero grid, entry for entry, with carried entries of different counts per sequence (a phased batch), windows
    that start mid-call, and no carried entries given (zeros)."""
    inputs = delta_inputs("gdn", batch=3, seqlen=13, heads=1, value_heads=2, dk=8, dv=6)
    start = phased_start("gdn", inputs, "nvfp4/fp16sr@5", warmup=(0, 3, 7))
    p = FAMILIES["gdn"].RULE.prepare(*cut(inputs, 0), start, ReplayConfig.parse("nvfp4/fp16sr@5"))
    seg = chunked_module.segment_layout(p)
    buf = p.state.buffer
    assert int(p.state.schedule.count.max()) > 0 and seg.num > 1
    for tok, carried in ((p.v, buf["u"]), (p.g, buf["g"]), (torch.randn_like(p.v), buf["u"].float()), (p.v, None)):
        size = tok.shape[0] * seg.num * seg.length
        want = tok.new_zeros(size + 1, *tok.shape[2:])  # the last row takes the slots past each sequence's count
        want[seg.tok_index.flatten()] = tok.flatten(0, 1)
        if carried is not None:
            want[seg.pre_index.flatten()] = carried[:, :seg.pre_index.shape[1]].flatten(0, 1).to(tok.dtype)
        got = chunked_module.pad_segments(seg, tok, carried)
        assert torch.equal(got, want[:size].view(got.shape))


@FAM
@pytest.mark.parametrize("text", ["nvfp4/fp16sr@4", "fp16sr@1", "nvfp4/fp16sr@16", "nvfp4/fp16sr@5#spec=3:0.6"])
@pytest.mark.parametrize("seqlen", [0, 9, 26])
def test_segments_from_host_counts(fam, text, seqlen):
    """The segment grid from the host's schedule counts (no device read) equals the one read from the device."""
    mod = FAMILIES[fam]
    inputs = delta_inputs(fam)
    start = phased_start(fam, inputs, text)
    remember_host(start.schedule.count, start.schedule.count.tolist())
    p = mod.RULE.prepare(*cut(inputs, 6, 6 + seqlen), start, text, compute_dtype=torch.float64)
    assert p.plan.shape is not None
    host = chunked_module.segment_layout(p)
    device = chunked_module.segment_layout(dataclasses.replace(p, plan=dataclasses.replace(p.plan, shape=None)))
    assert (host.num, host.length) == (device.num, device.length)
    for name in ("tok_index", "pre_index", "folds", "last", "count_after"):
        assert torch.equal(getattr(host, name), getattr(device, name)), name

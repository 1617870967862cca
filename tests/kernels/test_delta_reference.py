"""The delta-rule step references (GDN, KDA) against an independent naive recurrence (plain loops, formats where
the semantics say).

The naive decoder and the plain recurrence are in `tests.helpers.delta`. Tests run for both families (`fam`).
"""

import pytest
import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels import gdn, kda
from replayssm_eval.kernels.delta._common import checkpoint_kv
from replayssm_eval.replay.host_values import remember_nonpositive
from replayssm_eval.replay.state import write_checkpoint

from tests.helpers.compare import assert_close
from tests.helpers.delta import (
    DV, FAMILIES, MATRIX, WARMUP, cut, delta_inputs, naive_delta_decode, phased_start, plain_recurrence,
)
from tests.helpers.replay import CONFIGS, WINDOWS


def _config(text, window, fold):
    return ReplayConfig.parse(text).replace(window=window, gdn_fold=fold)


FAM = pytest.mark.parametrize("fam", list(FAMILIES))


@FAM
@pytest.mark.parametrize("window, fold", MATRIX)
@pytest.mark.parametrize("text", CONFIGS + ["nvfp4/fp16sr#skip=0.6"])
def test_reference_matches_naive(fam, text, window, fold):
    """Batched, per-sequence phases, fp64: outputs to 1e-10 and the very same stored checkpoints."""
    inputs = delta_inputs(fam, seqlen=11 if window == 1 else 21)
    cfg = _config(text, window, fold)
    start = phased_start(fam, inputs, cfg)
    o, st = FAMILIES[fam].decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    hi, lo = checkpoint_kv(st)
    for b, w in enumerate(WARMUP):
        full = [torch.cat([t[b, :w], t[b]]) for t in inputs[:5]] + [inputs[5][b]]
        want, want_hi, want_lo = naive_delta_decode(full, cfg, b)
        assert_close(f"o[{b}]", want[w:], o[b], 1e-10)
        assert torch.equal(want_hi.float(), hi[b]), f"S_hi of sequence {b} differs"
        assert torch.equal(want_lo.float(), lo[b]), f"S_lo of sequence {b} differs"


def _decode_both(fam, seqlen, config_a, config_b):
    """decode_reference of delta_inputs(fam, seqlen) under two configs (fp64): [(o, state)] * 2."""
    inputs = delta_inputs(fam, seqlen=seqlen)
    return [FAMILIES[fam].decode_reference(*inputs, cfg, compute_dtype=torch.float64) for cfg in (config_a, config_b)]


@FAM
def test_skip_is_live(fam):
    """With a strong decay the skip drops the checkpoint term for some heads (and not for all)."""
    (o_ref, _), (o_skip, _) = _decode_both(fam, 12, "nvfp4/fp16sr@8", "nvfp4/fp16sr@8#skip=0.5")
    changed = ((o_ref - o_skip).abs() > 1e-12).any(-1)  # [B, T, HV]
    assert changed.any() and not changed.all()


@FAM
@pytest.mark.parametrize("fold", ["open", "closed"])
@pytest.mark.parametrize("window", WINDOWS)
def test_fp32_formats_equal_plain_recurrence(fam, window, fold):
    inputs = delta_inputs(fam, dtype=torch.float32)
    want, want_state = plain_recurrence(inputs)
    o, st = FAMILIES[fam].decode_reference(*inputs, _config("fp32/fp32", window, fold))
    assert_close("o", want, o, 1e-5)
    if window == 1 or inputs[0].shape[1] % window == 0:
        assert_close("state", want_state, checkpoint_kv(st)[0], 1e-5)


def test_kda_matches_hf_recurrent_kernel():
    """The FP32 config equals transformers' `recurrent_kimi_delta_attention` on raw q, k (it normalises and scales)."""
    hf = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    gen = torch.Generator().manual_seed(3)
    q_raw, k_raw = torch.randn(2, 9, 3, 16, generator=gen), torch.randn(2, 9, 3, 16, generator=gen)
    v = torch.randn(2, 9, 3, 8, generator=gen)
    g = -torch.rand(2, 9, 3, 16, generator=gen)
    beta = torch.rand(2, 9, 3, generator=gen)
    s0 = torch.randn(2, 3, 16, 8, generator=gen)
    recurrent = getattr(hf.recurrent_kimi_delta_attention, "__wrapped__", hf.recurrent_kimi_delta_attention)
    want, want_state = recurrent(q_raw, k_raw, v, g, beta, s0, True, use_qk_l2norm_in_kernel=True)
    q, k = hf.l2norm(q_raw) * 16**-0.5, hf.l2norm(k_raw)
    o, st = kda.decode_reference(q, k, v, g, beta, s0, "fp32")
    assert_close("o", want, o, 1e-5)
    assert_close("state", want_state, checkpoint_kv(st)[0], 1e-5)


@pytest.mark.parametrize("text", ["fp32/fp32@4", "nvfp4/fp16sr@4#closed", "nvfp4/fp8sr@16", "fp16@1", "nvfp4/fp32@4#skip=0.7"])
def test_constant_channel_decay_is_gdn(text):
    """g constant over K: KDA is Gated DeltaNet with that scalar g (outputs to 1e-10, identical checkpoints)."""
    q, k, v, g, beta, s0 = delta_inputs("kda", seqlen=14, decay=0.5)
    g_head = g[..., 0]  # [B, T, HV]
    o_kda, st_kda = kda.decode_reference(q, k, v, g_head[..., None].expand_as(g), beta, s0, text, compute_dtype=torch.float64)
    o_gdn, st_gdn = gdn.decode_reference(q, k, v, g_head, beta, s0, text, compute_dtype=torch.float64)
    assert_close("o", o_gdn, o_kda, 1e-10)
    assert torch.equal(st_gdn.hi, st_kda.hi) and torch.equal(st_gdn.lo, st_kda.lo)


@FAM
def test_closed_fold_keeps_recurrence_exact(fam):
    """nvfp4 read copy: the closed fold's S_hi is the plain recurrence rounded at fold points; the open one is not."""
    inputs = delta_inputs(fam, seqlen=32)
    cfg = ReplayConfig.parse("nvfp4/fp16sr@8#closed")
    _, want = plain_recurrence(inputs, round_every=8, config=cfg)
    _, closed = FAMILIES[fam].decode_reference(*inputs, cfg, compute_dtype=torch.float64)
    _, opened = FAMILIES[fam].decode_reference(*inputs, cfg.replace(gdn_fold="open"), compute_dtype=torch.float64)
    assert torch.equal(checkpoint_kv(closed)[0], want.float())
    gap = (checkpoint_kv(opened)[0] - want).norm() / want.norm()
    assert gap > 1e-3, f"open fold should carry the read copy's error into S_hi, relative gap only {gap:.2e}"


@FAM
@pytest.mark.parametrize("text", ["nvfp4", "fp8sr", "fp16sr"])
def test_window_one_is_eager_decoding(fam, text):
    """L = 1, shared format: output from the unrounded updated state, the stored state rounded every step."""
    inputs = delta_inputs(fam, seqlen=13)
    cfg = ReplayConfig.parse(text)
    assert cfg.window == 1 and cfg.shared
    o, st = FAMILIES[fam].decode_reference(*inputs, cfg, compute_dtype=torch.float64)
    q, k, v, g, beta, s0 = inputs
    seq = torch.arange(q.shape[0])
    hi, _ = write_checkpoint(s0.transpose(-1, -2), cfg, 0, seq, torch.zeros_like(seq))
    state = hi.transpose(-1, -2).double()
    for t in range(q.shape[1]):
        step = [x[:, t:t + 1] for x in (q, k, v, g, beta)]
        want_o, state_new = plain_recurrence(step + [state])
        assert_close(f"o[:, {t}]", want_o[:, 0], o[:, t], 1e-12)
        hi, _ = write_checkpoint(state_new.transpose(-1, -2), cfg, 0, seq, torch.full_like(seq, t + 1))
        state = hi.transpose(-1, -2).double()
    assert torch.equal(checkpoint_kv(st)[0], state.float())


@FAM
def test_window_one_folds_coincide(fam):
    (o_open, st_open), (o_closed, st_closed) = _decode_both(fam, 9, "nvfp4/fp16sr@1", "nvfp4/fp16sr@1#closed")
    assert_close("o", o_open, o_closed, 1e-14)
    assert torch.equal(st_open.hi, st_closed.hi) and torch.equal(st_open.lo, st_closed.lo)


@FAM
def test_read_copy_is_used(fam):
    """A quantized read copy changes non-flush outputs (the read path is live); a closed flush output is exact again."""
    (o_ref, _), (o_q, _) = _decode_both(fam, 8, "fp32/fp32@4", "nvfp4/fp32@4#closed")
    assert (o_q - o_ref)[:, 0].abs().max() > 1e-4
    assert_close("closed flush output", o_ref[:, 3], o_q[:, 3], 1e-6)


@FAM
def test_split_call_continues(fam):
    inputs = delta_inputs(fam)
    decode = FAMILIES[fam].decode_reference
    cfg = "nvfp4/fp8sr@4#closed"
    o, st = decode(*inputs, cfg, compute_dtype=torch.float64)
    o1, mid = decode(*cut(inputs, 0, 10), inputs[5], cfg, compute_dtype=torch.float64)
    o2, end = decode(*cut(inputs, 10), mid, cfg, compute_dtype=torch.float64)
    assert torch.equal(torch.cat([o1, o2], 1), o)
    assert torch.equal(end.hi, st.hi) and torch.equal(end.lo, st.lo)
    for name in st.buffer:
        assert torch.equal(end.buffer[name], st.buffer[name]), name


def _bad(fam, **change):
    q, k, v, g, beta, s0 = delta_inputs(fam, batch=2, seqlen=3, dtype=torch.float32)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=s0, config="nvfp4/fp32@4")
    args.update(change)
    return args


BAD = [
    (lambda a: dict(k=a["k"][:, :2]), r"k has shape \[2, 2, 2, 20\], expected \[2, 3, 2, 20\]"),
    (lambda a: dict(v=a["v"][:, :, :3]), "multiple of the 2 key heads"),
    (lambda a: dict(g=a["g"].to(torch.int32)), "g has dtype torch.int32"),
    (lambda a: dict(beta=a["beta"][..., None]), r"beta has shape .*expected \[2, 3, 4\]"),
    (lambda a: dict(initial_state=a["initial_state"][:, :, :5]), r"initial_state has shape .*expected \[2, 4, 20, {dv}\]"),
    (lambda a: dict(initial_state=None), "initial_state must be the FP32 state"),
    (lambda a: dict(config="nvfp5/fp32"), "unknown state format 'nvfp5'"),
    (lambda a: dict(config=16), "config must be a ReplayConfig"),
    (lambda a: dict(q=a["q"].to("meta")), "k is on cpu, expected meta"),
]
BAD_G = {  # the decay's shape
    "gdn": [(lambda a: dict(g=a["g"][..., None]), r"g has shape \[2, 3, 4, 1\], expected \[2, 3, 4\]")],
    "kda": [
        (lambda a: dict(g=a["g"][..., 0]), r"g has shape \[2, 3, 4\], expected \[2, 3, 4, 20\]"),
        (lambda a: dict(g=a["g"][..., :5]), r"g has shape \[2, 3, 4, 5\], expected \[2, 3, 4, 20\]"),
        (lambda a: dict(g=-a["g"] + 0.1), "g is a log-decay and must be <= 0, got a maximum of"),
    ],
}


@pytest.mark.parametrize("fam, change, message", [(f, c, m) for f in FAMILIES for c, m in BAD + BAD_G[f]])
def test_bad_input(fam, change, message):
    args = _bad(fam)
    args.update(change(args))
    with pytest.raises(ValueError, match=message.format(dv=DV[fam])):
        FAMILIES[fam].decode_reference(**args)


def test_kda_takes_vouched_log_decays_unread():
    """Log-decays vouched for as <= 0 (`remember_nonpositive`: the model hooks, for the gate's g) skip the check's read;
    the same tensor written in place since is checked again."""
    args = _bad("kda")
    g = -args["g"] + 0.1  # positive somewhere: the check would refuse it
    remember_nonpositive(g)
    FAMILIES["kda"].decode_reference(**{**args, "g": g})
    g.add_(0.0)  # written in place: no longer vouched for
    with pytest.raises(ValueError, match="g is a log-decay and must be <= 0"):
        FAMILIES["kda"].decode_reference(**{**args, "g": g})


@FAM
def test_bad_options(fam):
    q, k, v, g, beta, s0 = delta_inputs(fam, batch=2, seqlen=3, dtype=torch.float32)
    decode = FAMILIES[fam].decode_reference
    with pytest.raises(ValueError, match="compute_dtype must be torch.float32 or torch.float64"):
        decode(q, k, v, g, beta, s0, "fp32", compute_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"seq_ids has shape \[3\], expected \[2\]"):
        decode(q, k, v, g, beta, s0, "fp32", seq_ids=torch.arange(3))
    _, st = decode(q, k, v, g, beta, s0, "nvfp4/fp32@4", layer_idx=2)
    with pytest.raises(ValueError, match="belongs to layer 2, expected layer_idx=0"):
        decode(q, k, v, g, beta, st, "nvfp4/fp32@4")
    with pytest.raises(ValueError, match="a closed fold needs k, u, g, v, beta"):
        decode(q, k, v, g, beta, st, "nvfp4/fp32@4#closed", layer_idx=2)
    assert checkpoint_kv(st)[0].shape == (2, 4, 20, DV[fam])


@pytest.mark.parametrize("fold", ["open", "closed"])
def test_kda_buffer_dtype_rounds_buffered_inputs(fold):
    """#buf=bf16 rounds k and beta (and v with the closed fold) as appended: pre-rounded inputs change nothing;
    the buffer holds k and u in bf16 (tests/kernels/test_buffer_dtype.py checks u against a hand-built recurrence)."""
    bf16 = lambda t: t.to(torch.bfloat16).to(t.dtype)  # noqa: E731
    q, k, v, g, beta, s0 = delta_inputs("kda", batch=2, seqlen=9, heads=1, value_heads=2, dk=6, dv=5, dtype=torch.float32)
    cfg = ReplayConfig.parse("nvfp4/fp16sr@4").replace(gdn_fold=fold)
    o, st = kda.decode_reference(q, k, v, g, beta, s0, cfg.replace(buffer_dtype="bf16"))
    o_want, _ = kda.decode_reference(q, bf16(k), bf16(v) if fold == "closed" else v, g, bf16(beta), s0,
                                     cfg.replace(buffer_dtype="bf16"))
    assert torch.equal(o, o_want)
    assert torch.equal(st.buffer["k"], bf16(st.buffer["k"])) and torch.equal(st.buffer["u"], bf16(st.buffer["u"]))
    o32, _ = kda.decode_reference(q, k, v, g, beta, s0, cfg)
    assert (o32 - o).abs().max() > 1e-4, "a bf16 buffer must change the outputs"
    inputs = [t.double() for t in (q, k, v, g, beta, s0)]
    o_ref, st_ref = kda.decode_reference(*inputs, cfg.replace(buffer_dtype="bf16"), compute_dtype=torch.float64)
    o_chunk, st_chunk = kda.chunked(*inputs, cfg.replace(buffer_dtype="bf16"), compute_dtype=torch.float64)
    assert_close("chunked o", o_ref, o_chunk, 1e-10)
    assert torch.equal(st_ref.hi, st_chunk.hi) and torch.equal(st_ref.lo, st_chunk.lo)

"""The delta-rule step references (GDN, KDA) against an independent naive recurrence (plain loops, formats where
the semantics say).

The naive decoder below keeps, per sequence, S_hi, S_lo and a Python list of buffered entries,
rebuilds S_{t-1} by running the recursion S <- A S + k u^T over the list (A = exp(g), a scalar for
GDN, diag(exp(g)) for KDA; the reference uses closed-form cumulative decays instead), and finds
flushes from its own counter. Tests run for both families (`fam`); the other delta-rule test files
import `FAMILIES`, `make_inputs`, `assert_close`, `naive_decode`, `plain_recurrence` and the helpers
from here.
"""

import pytest
import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels import gdn, kda
from replayssm_eval.kernels.delta._common import checkpoint_kv
from replayssm_eval.replay.schedule import ScheduleState
from replayssm_eval.replay.state import ReplayState, write_checkpoint

FAMILIES = {"gdn": gdn, "kda": kda}
DV = {"gdn": 24, "kda": 12}  # default value head size of `make_inputs`
CONFIGS = ["fp32", "shared:nvfp4", "nvfp4/fp16sr", "nvfp4/fp8sr", "fp16/fp32"]
WINDOWS = [1, 4, 16]
WARMUP = (0, 3, 6)  # tokens decoded per sequence before the batched call: per-sequence window phases


def assert_close(name, ref, got, rtol, atol=0.0):
    """Max abs error against atol + rtol * max|ref|, reporting the RMS ratio ||got - ref|| / ||ref||."""
    ref, got = ref.double(), got.double()
    err = (got - ref).abs().max().item() if ref.numel() else 0.0
    rms = ((got - ref).norm() / ref.norm().clamp(min=1e-300)).item()
    bound = atol + rtol * ref.abs().max().item()
    assert err <= bound, f"{name}: max abs err {err:.3e} > {bound:.3e} (RMS ratio {rms:.3e})"


def make_inputs(fam="gdn", batch=3, seqlen=37, heads=2, value_heads=4, dk=20, dv=None, dtype=torch.float64, seed=0, device="cpu",
                decay=0.25):
    """q, k L2-normalised (q scaled by K^-0.5) as the HF layer passes them, g <= 0, beta in (0, 1), S0 on the FP32 grid.

    Heads decay at rates from slow to `decay`; with KDA's per-channel g [B, T, HV, K] each channel at 1/2 to 1 times
    its head's rate."""
    dv = DV[fam] if dv is None else dv
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q = torch.nn.functional.normalize(rand(batch, seqlen, heads, dk), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(rand(batch, seqlen, heads, dk), dim=-1)
    v = rand(batch, seqlen, value_heads, dv)
    rate = torch.linspace(0.01, decay, value_heads, dtype=torch.float64)  # per-head rates: some slow heads, some fast
    if fam == "kda":
        rate = rate[:, None] * (0.5 + 0.5 * torch.rand(value_heads, dk, generator=gen, dtype=torch.float64))
        g = -rate * torch.rand(batch, seqlen, value_heads, dk, generator=gen, dtype=torch.float64) * 2
    else:
        g = -rate * torch.rand(batch, seqlen, value_heads, generator=gen, dtype=torch.float64) * 2
    beta = torch.rand(batch, seqlen, value_heads, generator=gen, dtype=torch.float64)
    s0 = rand(batch, value_heads, dk, dv).float().double()
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, g, beta, s0)]


def cut(inputs, start, stop=None, rows=None):
    """Tokens [start, stop) (and batch rows) of (q, k, v, g, beta)."""
    out = [t[:, start:stop] for t in inputs[:5]]
    return out if rows is None else [t[rows] for t in out]


def stack_states(states):
    """Concatenate per-sequence ReplayStates along the batch (continuous batching)."""
    cat = lambda ts: torch.cat(list(ts))  # noqa: E731
    first = states[0]
    hi = cat(s.hi for s in states)
    lo = hi if first.lo is first.hi else cat(s.lo for s in states)
    sched = ScheduleState(*(cat(getattr(s.schedule, f) for s in states) for f in ("count", "step_left", "step_read_hi", "steps")))
    return ReplayState(
        hi=hi, lo=lo, buffer={n: cat(s.buffer[n] for s in states) for n in first.buffer}, schedule=sched,
        checkpoint=cat(s.checkpoint for s in states), seq_ids=cat(s.seq_ids for s in states), layer=first.layer,
    )


def phased_start(fam, inputs, config, warmup=WARMUP, decode=None, dtype=torch.float64):
    """Decode `warmup[b]` tokens of sequence b alone (seq id b), then stack: a batch with differing phases."""
    decode = decode or FAMILIES[fam].decode_reference
    states = []
    for b, w in enumerate(warmup):
        one = [t[b:b + 1, :w] for t in inputs[:5]]
        _, st = decode(*one, inputs[5][b:b + 1], config, seq_ids=torch.tensor([b], device=inputs[0].device), compute_dtype=dtype)
        states.append(st)
    return stack_states(states)


def naive_decode(inputs, config, seq_id, layer=0):
    """One sequence (inputs without the batch dim), fixed window, every token from the anchor: plain loops.

    g: [T, HV] (GDN) or [T, HV, K] (KDA). Returns (o [T, HV, V], S_hi, S_lo [HV, K, V])."""
    cfg = ReplayConfig.parse(config) if isinstance(config, str) else config
    q, k, v, g, beta, s0 = (t.double() for t in inputs)
    groups = v.shape[1] // q.shape[1]
    seq = torch.tensor([seq_id])

    def store(state, index):
        hi, lo = write_checkpoint(state.transpose(-1, -2)[None], cfg, layer, seq, torch.tensor([index]))
        return hi[0].transpose(-1, -2).double(), lo[0].transpose(-1, -2).double()

    def rows(decay):  # a scalar decay, or a per-channel one scaling the rows of S
        return decay[:, None] if decay.dim() else decay

    def skipped(decay):  # every channel's cumulative decay below eps
        return cfg.skip_read_below is not None and bool((decay < cfg.skip_read_below).all())

    s_hi, s_lo = store(s0, 0)
    entries, outs, ckpt = [], [], 0
    for t in range(q.shape[0]):
        flush = len(entries) == cfg.window - 1
        out_t = torch.empty(v.shape[1:], dtype=torch.float64)
        new = []
        for h in range(v.shape[1]):
            kh, qh = k[t, h // groups], q[t, h // groups]
            decay = torch.exp(sum(e["g"][h] for e in entries) + g[t, h])  # cumulative since the checkpoint
            read = s_hi[h] if flush else s_lo[h]
            s = torch.zeros_like(read) if skipped(decay) else read.clone()
            for e in entries:  # S_{t-1}, rebuilt by recursion
                s = rows(torch.exp(e["g"][h])) * s + torch.outer(e["k"][h // groups], e["u"][h])
            s = rows(torch.exp(g[t, h])) * s
            u = beta[t, h] * (v[t, h] - s.T @ kh)
            out_t[h] = (s + torch.outer(kh, u)).T @ qh
            new.append(u)
        entries.append(dict(k=k[t], u=torch.stack(new), g=g[t], v=v[t], beta=beta[t]))
        if flush:
            folded = torch.empty_like(s_hi)
            for h in range(v.shape[1]):
                decay = torch.exp(sum(e["g"][h] for e in entries))
                s = torch.zeros_like(s_hi[h]) if skipped(decay) else s_hi[h].clone()
                for e in entries:
                    kh = e["k"][h // groups]
                    s = rows(torch.exp(e["g"][h])) * s
                    if cfg.gdn_fold == "open":
                        s = s + torch.outer(kh, e["u"][h])
                    else:  # exact delta rule from S_hi
                        s = s + torch.outer(kh, e["beta"][h] * (e["v"][h] - s.T @ kh))
                folded[h] = s
                if cfg.gdn_fold == "closed":
                    out_t[h] = s.T @ q[t, h // groups]
            ckpt += 1
            s_hi, s_lo = store(folded, ckpt)
            entries = []
        outs.append(out_t)
    return torch.stack(outs), s_hi, s_lo


def plain_recurrence(inputs, round_every=None, config=None, layer=0):
    """The exact recurrence over all sequences, written as HF's recurrent loop (per-channel g [B, T, HV, K] or
    scalar g [B, T, HV]); optionally rounding the state via write_checkpoint every n tokens."""
    q, k, v, g, beta, state = (t.double() for t in inputs)
    groups = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(groups, 2), k.repeat_interleave(groups, 2)
    seq = torch.arange(q.shape[0])
    outs, index = [], 0
    if round_every:  # the prefill checkpoint
        hi, _ = write_checkpoint(state.transpose(-1, -2), config, layer, seq, torch.zeros_like(seq))
        state = hi.transpose(-1, -2).double()
    for t in range(q.shape[1]):
        decay = g[:, t].exp()
        state = state * (decay[..., None] if g.dim() == 4 else decay[..., None, None])
        delta = (v[:, t] - (state * k[:, t, ..., None]).sum(-2)) * beta[:, t, :, None]
        state = state + k[:, t, ..., None] * delta[..., None, :]
        outs.append((state * q[:, t, ..., None]).sum(-2))
        if round_every and (t + 1) % round_every == 0:
            index += 1
            hi, _ = write_checkpoint(state.transpose(-1, -2), config, layer, seq, torch.full_like(seq, index))
            state = hi.transpose(-1, -2).double()
    return torch.stack(outs, 1), state


def _config(text, window, fold):
    return ReplayConfig.parse(text).replace(window=window, gdn_fold=fold)


MATRIX = [(w, f) for w in WINDOWS for f in ("open", "closed") if (w, f) != (1, "closed")]  # L = 1: open == closed
FAM = pytest.mark.parametrize("fam", list(FAMILIES))


@FAM
@pytest.mark.parametrize("window, fold", MATRIX)
@pytest.mark.parametrize("text", CONFIGS + ["nvfp4/fp16sr#skip=0.6"])
def test_reference_matches_naive(fam, text, window, fold):
    """Batched, per-sequence phases, fp64: outputs to 1e-10 and the very same stored checkpoints."""
    inputs = make_inputs(fam, seqlen=11 if window == 1 else 21)
    cfg = _config(text, window, fold)
    start = phased_start(fam, inputs, cfg)
    o, st = FAMILIES[fam].decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    hi, lo = checkpoint_kv(st)
    for b, w in enumerate(WARMUP):
        full = [torch.cat([t[b, :w], t[b]]) for t in inputs[:5]] + [inputs[5][b]]
        want, want_hi, want_lo = naive_decode(full, cfg, b)
        assert_close(f"o[{b}]", want[w:], o[b], 1e-10)
        assert torch.equal(want_hi.float(), hi[b]), f"S_hi of sequence {b} differs"
        assert torch.equal(want_lo.float(), lo[b]), f"S_lo of sequence {b} differs"


def _decode_both(fam, seqlen, config_a, config_b):
    """decode_reference of make_inputs(fam, seqlen) under two configs (fp64): [(o, state)] * 2."""
    inputs = make_inputs(fam, seqlen=seqlen)
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
    inputs = make_inputs(fam, dtype=torch.float32)
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
    q, k, v, g, beta, s0 = make_inputs("kda", seqlen=14, decay=0.5)
    g_head = g[..., 0]  # [B, T, HV]
    o_kda, st_kda = kda.decode_reference(q, k, v, g_head[..., None].expand_as(g), beta, s0, text, compute_dtype=torch.float64)
    o_gdn, st_gdn = gdn.decode_reference(q, k, v, g_head, beta, s0, text, compute_dtype=torch.float64)
    assert_close("o", o_gdn, o_kda, 1e-10)
    assert torch.equal(st_gdn.hi, st_kda.hi) and torch.equal(st_gdn.lo, st_kda.lo)


@FAM
def test_closed_fold_keeps_recurrence_exact(fam):
    """nvfp4 read copy: the closed fold's S_hi is the plain recurrence rounded at fold points; the open one is not."""
    inputs = make_inputs(fam, seqlen=32)
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
    inputs = make_inputs(fam, seqlen=13)
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
    inputs = make_inputs(fam)
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
    q, k, v, g, beta, s0 = make_inputs(fam, batch=2, seqlen=3, dtype=torch.float32)
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


@FAM
def test_bad_options(fam):
    q, k, v, g, beta, s0 = make_inputs(fam, batch=2, seqlen=3, dtype=torch.float32)
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
    q, k, v, g, beta, s0 = make_inputs("kda", batch=2, seqlen=9, heads=1, value_heads=2, dk=6, dv=5, dtype=torch.float32)
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

"""`#buf=DTYPE`: what the buffer dtype rounds, checked against hand-built recurrences, and every engine agreeing.

Mamba-2 buffers x and B rounded (the D x term uses x as given) and its fold rounds the scaled keys
dt_i G_{i+1..} B_i before the product with x; GDN and KDA buffer k and beta rounded (and v with the
closed fold) and each u rounded when appended, while a token's own output uses its u as computed.
"""

import pytest
import torch

from replayssm_eval.kernels import gdn, kda, mamba2
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.delta.reference import verify_drafts as gdn_verify
from replayssm_eval.kernels.mamba2 import triton_step as m2_triton
from replayssm_eval.replay.state import write_checkpoint

from tests.helpers.compare import assert_close
from tests.helpers.delta import cut, delta_inputs, one_column_share, phased_start
from tests.helpers.mamba2 import mamba2_inputs, sliced

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _rounder(buf):
    return lambda t: t.to(DTYPES[buf]).to(t.dtype) if buf != "fp32" else t


def _fp32_grid(state):
    """A fold stored in FP32 (the `fp32` format's checkpoint of an FP64 computation)."""
    return state.float().double()


def test_parse_and_name():
    cfg = ReplayConfig.parse("nvfp4/fp16sr#buf=bf16")
    assert cfg.buffer_dtype == "bf16" and cfg.name == "nvfp4/fp16sr#buf=bf16"
    assert ReplayConfig.parse(cfg.name) == cfg
    assert ReplayConfig.parse("nvfp4/fp16sr#buf=fp32") == ReplayConfig.parse("nvfp4/fp16sr")
    assert not ReplayConfig.parse("fp32#buf=fp16").is_reference
    with pytest.raises(ValueError, match="bad option #buf=fp8.*buf=fp32\\|bf16\\|fp16"):
        ReplayConfig.parse("fp32#buf=fp8")
    with pytest.raises(ValueError, match="unknown buffer dtype 'int8'; known: fp32, bf16, fp16"):
        ReplayConfig(buffer_dtype="int8")


# ---------------------------------------------------------------- hand-built recurrences (FP32 checkpoints, FP64 math)

def _mamba2_by_hand(inputs, window, buf, round_fold=True):
    """y and the last checkpoint of Mamba-2 with FP32 checkpoints every `window` tokens, x and B rounded to `buf`, and
    the fold's scaled keys dt_i G_{i+1..L} B_i rounded too (unless round_fold=False). One group (B, C [B, T, 1, N])."""
    x, dt, A, B, C, D, s0 = (t.double() for t in inputs)
    r = _rounder(buf)
    xb, Bb = r(x), r(B[:, :, 0])  # [B, T, H, P], [B, T, N]
    ckpt, start, ys = _fp32_grid(s0), 0, []
    for t in range(x.shape[1]):
        span = range(start, t + 1)
        log_g = torch.stack([dt[:, i] * A for i in span], 1).cumsum(1)  # [B, E, H] log G_{start..i}
        g_now = log_g[:, -1]  # [B, H]
        y = torch.exp(g_now)[..., None] * torch.einsum("bhpn,bn->bhp", ckpt, C[:, t, 0])
        for e, i in enumerate(span):
            w = dt[:, i] * torch.exp(g_now - log_g[:, e])  # [B, H] dt_i G_{i+1..t}
            y = y + (w * (Bb[:, i] * C[:, t, 0]).sum(-1)[:, None])[..., None] * xb[:, i]
        ys.append(y + D[:, None] * x[:, t])
        if t + 1 - start == window:
            fold = torch.exp(g_now)[..., None, None] * ckpt
            for e, i in enumerate(span):
                w = dt[:, i] * torch.exp(g_now - log_g[:, e])
                scaled = w[..., None] * Bb[:, i, None, :]  # [B, H, N]
                fold = fold + xb[:, i, :, :, None] * (r(scaled) if round_fold else scaled)[:, :, None, :]
            ckpt, start = _fp32_grid(fold), t + 1
    return torch.stack(ys, 1), ckpt


def _delta_by_hand(inputs, window, buf, decay, round_u=True):
    """o and the last checkpoint [B, HV, K, V] of the open-fold delta rule with FP32 checkpoints every `window`
    tokens: k and beta rounded to `buf`, each u rounded before the state takes it (unless round_u=False), a token's
    output from its u as computed. decay(g_t) multiplies the [B, HV, K, V] state (GDN: a scalar per head, KDA: one
    per key channel)."""
    q, k, v, g, beta, s0 = (t.double() for t in inputs)
    r = _rounder(buf)
    groups = v.shape[2] // q.shape[2]
    q, k, beta = q.repeat_interleave(groups, 2), r(k).repeat_interleave(groups, 2), r(beta)
    state = ckpt = _fp32_grid(s0)  # [B, HV, K, V]
    outs = []
    for t in range(q.shape[1]):
        s_dec = decay(g[:, t]) * state
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", s_dec, k[:, t]))
        outs.append(torch.einsum("bhkv,bhk->bhv", s_dec + k[:, t, ..., None] * u[..., None, :], q[:, t]))
        state = s_dec + k[:, t, ..., None] * (r(u) if round_u else u)[..., None, :]
        if (t + 1) % window == 0:
            state = ckpt = _fp32_grid(state)
    return torch.stack(outs, 1), ckpt


def _gdn_decay(g):  # g [B, HV] -> [B, HV, 1, 1]
    return torch.exp(g)[..., None, None]


def _kda_decay(g):  # g [B, HV, K] -> [B, HV, K, 1]
    return torch.exp(g)[..., None]


@pytest.mark.parametrize("buf", ["bf16", "fp16"])
def test_mamba2_reference_equals_hand_built(buf):
    inputs = mamba2_inputs(batch=2, tokens=11, heads=3, head_dim=5, groups=1, d_state=7)
    cfg = ReplayConfig.parse(f"fp32@4#buf={buf}")
    y, st = mamba2.decode_reference(*inputs, cfg, compute_dtype=torch.float64)
    y_want, ckpt = _mamba2_by_hand(inputs, 4, buf)
    assert_close("y", y_want, y, 1e-12)
    assert_close("S_hi", ckpt, st.hi, 1e-7)  # FP32 checkpoints of FP64 folds
    r = _rounder(buf)
    assert torch.equal(st.buffer["x"], r(st.buffer["x"])) and torch.equal(st.buffer["B"], r(st.buffer["B"]))
    # the fold's rounding is there: without it the checkpoints move by far more than the FP32 grid
    _, ckpt_inputs_only = _mamba2_by_hand(inputs, 4, buf, round_fold=False)
    assert (ckpt_inputs_only - st.hi).abs().max() > 1e3 * (ckpt - st.hi).abs().max() + 1e-6


@pytest.mark.parametrize("buf", ["bf16", "fp16"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_delta_rule_reference_equals_hand_built(family, buf):
    decode, decay = (gdn.decode_reference, _gdn_decay) if family == "gdn" else (kda.decode_reference, _kda_decay)
    inputs = delta_inputs(family, batch=2, seqlen=11, heads=1, value_heads=2, dk=6, dv=5)
    cfg = ReplayConfig.parse(f"fp32@4#buf={buf}")
    o, st = decode(*inputs, cfg, compute_dtype=torch.float64)
    o_want, ckpt = _delta_by_hand(inputs, 4, buf, decay)
    assert_close("o", o_want, o, 1e-10)
    assert_close("S_hi", ckpt.transpose(-1, -2), st.hi, 1e-7)
    r = _rounder(buf)
    assert torch.equal(st.buffer["u"], r(st.buffer["u"])) and torch.equal(st.buffer["k"], r(st.buffer["k"]))
    # u's rounding is there: without it the outputs move by far more than the FP32 grid
    o_inputs_only, _ = _delta_by_hand(inputs, 4, buf, decay, round_u=False)
    assert (o_inputs_only - o).abs().max() > 1e3 * (o_want - o).abs().max() + 1e-6


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_buffered_inputs_are_rounded_on_append(family):
    """Pre-rounded inputs give the same numbers: the engines round what they buffer (x, B; k, beta, closed v)."""
    r = _rounder("bf16")
    if family == "mamba2":
        x, dt, A, B, C, D, s0 = mamba2_inputs(batch=2, tokens=9, heads=3, head_dim=5, groups=1, d_state=7)
        cfg = ReplayConfig.parse("nvfp4/fp16sr@4#buf=bf16")
        y, st = mamba2.decode_reference(x, dt, A, B, C, D, s0, cfg, compute_dtype=torch.float64)
        y_want, st_want = mamba2.decode_reference(r(x), dt, A, r(B), C, D, s0, cfg, compute_dtype=torch.float64)
        assert_close("y", y_want + D[:, None] * (x - r(x)), y, 1e-12)  # D x uses x as given
        assert torch.equal(st.hi, st_want.hi)
        return
    decode = gdn.decode_reference if family == "gdn" else kda.decode_reference
    q, k, v, g, beta, s0 = delta_inputs(family, batch=2, seqlen=9, heads=1, value_heads=2, dk=6, dv=5)
    for fold in ("open", "closed"):
        cfg = ReplayConfig.parse("nvfp4/fp16sr@4#buf=bf16").replace(gdn_fold=fold)
        o, st = decode(q, k, v, g, beta, s0, cfg, compute_dtype=torch.float64)
        v_in = r(v) if fold == "closed" else v
        o_want, st_want = decode(q, r(k), v_in, g, r(beta), s0, cfg, compute_dtype=torch.float64)
        assert torch.equal(o, o_want) and torch.equal(st.hi, st_want.hi)


# ---------------------------------------------------------------- engines agree (FP64 torch, FP32 Triton interpreter)

@pytest.mark.parametrize("text", ["nvfp4/fp16sr@4#buf=bf16", "shared:fp8sr@3#buf=fp16#spec=2:0.6",
                                  "fp32@5#buf=fp16#skip=0.3"])
def test_mamba2_chunked_matches_reference(text):
    inputs = mamba2_inputs(batch=2, tokens=13, heads=3, head_dim=5, groups=3, d_state=7)
    y_ref, st_ref = mamba2.decode_reference(*inputs, text, compute_dtype=torch.float64)
    y, st = mamba2.chunked(*inputs, text, compute_dtype=torch.float64)
    assert_close("y", y_ref, y, 1e-10)
    assert torch.equal(st.hi, st_ref.hi) and torch.equal(st.lo, st_ref.lo)


def test_mamba2_speculative_reference_matches_reference():
    cfg = ReplayConfig.parse("nvfp4/fp16sr@6#spec=3:0.6#buf=bf16")
    inputs = mamba2_inputs(batch=2, tokens=13, heads=3, head_dim=5, groups=1, d_state=7)
    y_ref, st_ref = mamba2.decode_reference(*inputs, cfg, compute_dtype=torch.float64)
    y, st = mamba2.speculative_decode_reference(*inputs, cfg, compute_dtype=torch.float64)
    assert_close("y", y_ref, y, 1e-10)
    assert torch.equal(st.hi, st_ref.hi)


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("text", ["nvfp4/fp16sr@4#buf=bf16", "shared:fp16@5#buf=fp16#skip=0.3",
                                  "nvfp4/fp32@6#buf=bf16#spec=2:0.6"])
@pytest.mark.parametrize("fold", ["open", "closed"])
def test_delta_rule_chunked_matches_reference(family, text, fold):
    fam = gdn if family == "gdn" else kda
    inputs = delta_inputs(family, batch=2, seqlen=11, heads=1, value_heads=2, dk=6, dv=5)
    cfg = ReplayConfig.parse(text).replace(gdn_fold=fold)
    start = phased_start(family, inputs, cfg, warmup=(0, 2))  # carried buffer entries, sequences at other phases
    o_ref, st_ref = fam.decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    o, st = fam.chunked(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    assert_close("o", o_ref, o, 1e-10)
    assert torch.equal(st.hi, st_ref.hi) and torch.equal(st.lo, st_ref.lo)
    assert torch.equal(st.buffer["u"], st_ref.buffer["u"])


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_delta_rule_speculative_one_draft_matches_reference(family):
    """One draft per step: each u is rounded when committed, as decode_reference rounds it when appended."""
    fam = gdn if family == "gdn" else kda
    inputs = delta_inputs(family, batch=2, seqlen=11, heads=1, value_heads=2, dk=6, dv=5)
    cfg = ReplayConfig.parse("nvfp4/fp16sr@4#spec=1:0.5#buf=bf16")
    o_ref, st_ref = fam.decode_reference(*inputs, cfg, compute_dtype=torch.float64)
    o, st = fam.speculative_decode_reference(*inputs, cfg, compute_dtype=torch.float64)
    assert_close("o", o_ref, o, 1e-12)
    assert torch.equal(st.hi, st_ref.hi) and torch.equal(st.buffer["u"], st_ref.buffer["u"])


def test_mamba2_triton_matches_reference(device):
    """Chunked Triton, the single-token step and verify, against the reference with a bf16 buffer."""
    cfg = ReplayConfig.parse("nvfp4:scale=row/fp16sr@4#buf=bf16")
    inputs = tuple(t.to(device) for t in mamba2_inputs(batch=2, tokens=7, heads=3, head_dim=5, groups=1,
                                                             d_state=7, dtype=torch.float32))
    y_ref, st_ref = mamba2.decode_reference(*inputs, cfg)
    y, st = mamba2.chunked(*inputs, cfg, backend="triton")
    assert_close("chunked triton", y_ref, y, 1e-5, flips=0.02)
    assert_close("chunked triton S_hi", st_ref.hi, st.hi, 1e-5, flips=0.02)
    x, dt, A, B, C, D, state = inputs
    ys = []
    for n in range(x.shape[1]):
        y_n, state = m2_triton.decode_step_triton(x[:, n], dt[:, n], A, B[:, n], C[:, n], D, state, cfg)
        ys.append(y_n)
    assert_close("decode step", y_ref, torch.stack(ys, 1), 1e-5, flips=0.02)
    assert_close("decode step S_hi", st_ref.hi, state.hi, 1e-5, flips=0.02)
    assert torch.equal(state.buffer["x"], _rounder("bf16")(state.buffer["x"]))
    spec = cfg.replace(speculative=ReplayConfig.parse("fp32#spec=3:0.5").speculative, window=8)
    _, committed = mamba2.decode_reference(*sliced(inputs, 0, 2)[:6], inputs[6], spec)
    drafts = sliced(inputs, 2, 5)[:6]
    out = m2_triton.verify_triton(*drafts, committed, spec)
    y_drafts, _ = mamba2.decode_reference(*drafts, committed, spec.replace(window=16, speculative=None))
    assert_close("verify", y_drafts, out, 1e-5)


@pytest.mark.parametrize("buf", ["bf16", "fp16"])
def test_mamba2_triton_fold_rounding_is_exact(buf, device):
    """FP32 checkpoints: the Triton folds equal the reference's to FP32 summation error (1e-7 of the max), far below
    what the fold's rounding moves them (1e-4 to 1e-3 of the max)."""
    cfg = ReplayConfig.parse(f"fp32@3#buf={buf}")
    inputs = tuple(t.to(device) for t in mamba2_inputs(batch=2, tokens=7, heads=3, head_dim=5, groups=1,
                                                             d_state=7, dtype=torch.float32))
    _, st_ref = mamba2.decode_reference(*inputs, cfg)
    _, st = mamba2.chunked(*inputs, cfg, backend="triton")
    assert_close("chunked triton S_hi", st_ref.hi, st.hi, 1e-5)
    x, dt, A, B, C, D, state = inputs
    for n in range(x.shape[1]):
        _, state = m2_triton.decode_step_triton(x[:, n], dt[:, n], A, B[:, n], C[:, n], D, state, cfg)
    assert_close("decode step S_hi", st_ref.hi, state.hi, 1e-5)


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("text, fold", [
    ("nvfp4:scale=row/fp16sr@4#buf=bf16", "open"), ("nvfp4:scale=row/fp16sr@4#buf=bf16", "closed"),
    ("fp32@3#buf=fp16", "open"), ("fp32@3#buf=bf16", "closed"),
])
def test_delta_rule_triton_matches_reference(family, text, fold, device):
    """Chunked Triton and the single-token step against the reference; the buffers hold rounded u's.

    The engines differ by FP32 summation error (measured: at most 3e-7 of the max), far below what rounding u
    moves the outputs (3e-4 to 2e-3 of the max, at nearly every element). Now and then that error puts a value
    within an ulp of a rounding boundary (of a buffered u, an FP16 SR or an NVFP4 element) on the other side, on
    one CPU and not another: each comparison allows the elements one such flip can move (`one_column_share`)."""
    fam = gdn if family == "gdn" else kda
    cfg = ReplayConfig.parse(text).replace(gdn_fold=fold)
    inputs = delta_inputs(family, batch=2, seqlen=7, heads=1, value_heads=2, dk=6, dv=5, dtype=torch.float32, device=device)
    one_column = one_column_share(inputs)  # 1 / 20
    o_ref, st_ref = fam.decode_reference(*inputs, cfg)
    o, st = fam.chunked(*inputs, cfg, backend="triton")
    assert_close("chunked triton", o_ref, o, 1e-5, flips=one_column)
    assert_close("chunked triton u", st_ref.buffer["u"], st.buffer["u"], 1e-5, flips=one_column)
    assert_close("chunked triton S_hi", st_ref.hi, st.hi, 1e-5, flips=one_column)
    state, outs = inputs[5], []
    for n in range(inputs[0].shape[1]):
        o_n, state = fam.decode_step_triton(*cut(inputs, n, n + 1), state, cfg)
        outs.append(o_n)
    assert_close("decode step", o_ref, torch.cat(outs, 1), 1e-5, flips=one_column)
    assert_close("decode step S_hi", st_ref.hi, state.hi, 1e-5, flips=one_column)
    r = _rounder(cfg.buffer_dtype)
    for name in ("k", "u"):
        assert torch.equal(state.buffer[name], r(state.buffer[name])), name
        assert torch.equal(st.buffer[name], r(st.buffer[name])), name


def test_gdn_verify_reads_the_rounded_buffer(device):
    """Verification reads the committed u's as buffered (rounded) and solves the drafts' u's in FP32, as the
    reference's output-only verification."""
    cfg = ReplayConfig.parse("nvfp4/fp32@8#spec=4:0.5#buf=bf16")
    inputs = delta_inputs("gdn", batch=2, seqlen=7, heads=1, value_heads=2, dk=6, dv=5, dtype=torch.float32,
                                 device=device)
    st = inputs[5]
    for n in range(3):
        _, st = gdn.decode_step_triton(*cut(inputs, n, n + 1), st, cfg)
    assert torch.equal(st.buffer["u"], _rounder("bf16")(st.buffer["u"]))
    o = gdn.verify(*cut(inputs, 3, 7), st, cfg)
    r = _rounder("bf16")
    q, k, v, g, beta = cut(inputs, 3, 7)
    for b in range(2):
        ring = {name: t[b].clone() for name, t in st.buffer.items()}
        h = int(st.schedule.count[b])
        ring["k"][h:h + 4] = r(k[b])
        ring["g"][h:h + 4] = g[b]
        src = (st.hi if st.schedule.step_read_hi[b] else st.lo)[b].transpose(-1, -2)
        _, o_ref = gdn_verify(src, ring, h, 4, q[b].repeat_interleave(2, 1), v[b], r(beta[b]), 2, None)
        assert_close(f"o[{b}]", o_ref, o[b], 1e-5)


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_fp32_buffer_is_the_default(family):
    """`#buf=fp32` gives the default config's numbers bit for bit (reference, chunked); bf16 changes them."""
    if family == "mamba2":
        inputs, fam = mamba2_inputs(batch=2, tokens=9, heads=3, head_dim=5, groups=1, d_state=7), mamba2
    else:
        fam = gdn if family == "gdn" else kda
        inputs = delta_inputs(family, batch=2, seqlen=9, heads=1, value_heads=2, dk=6, dv=5)
    for fn in (fam.decode_reference, fam.chunked):
        a, st_a = fn(*inputs, "nvfp4/fp16sr@4#buf=fp32", compute_dtype=torch.float64)
        b, st_b = fn(*inputs, ReplayConfig(read="nvfp4", recur="fp16sr", window=4, shared=False),
                     compute_dtype=torch.float64)
        assert torch.equal(a, b) and torch.equal(st_a.hi, st_b.hi)
        c, _ = fn(*inputs, "nvfp4/fp16sr@4#buf=bf16", compute_dtype=torch.float64)
        assert not torch.equal(a, c)


def test_hand_built_checkpoint_is_write_checkpoint():
    """The hand-built recurrences store folds as `fp32`'s write_checkpoint does."""
    state = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    seq = torch.arange(2)
    hi, _ = write_checkpoint(state, ReplayConfig.parse("fp32@4"), 0, seq, torch.ones_like(seq))
    assert torch.equal(hi.double(), _fp32_grid(state))

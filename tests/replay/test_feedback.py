"""Error feedback (`ef=fp32|bf16`): a hand-written recurrence that keeps the residual itself, the chunked form
against the step reference, the residual carried across calls, and the Triton paths: the steps carry it, the chunked
kernels carry it where they round the copy (tests/kernels/test_delta_triton.py, test_mamba2_triton.py) and leave the
call to torch elsewhere."""

import dataclasses

import pytest
import torch

from replayssm_eval.formats import get_format
from replayssm_eval.formats.codec import Residual
from replayssm_eval.kernels import mamba2
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.keys import READ_COPY, RECUR_COPY
from replayssm_eval.replay.state import feedback_copies, write_checkpoint, write_read_copy_packed

from tests.helpers.compare import assert_close, assert_same_state, mostly_equal
from tests.helpers.delta import FAMILIES, cut, delta_inputs, phased_start
from tests.helpers.mamba2 import mamba2_inputs, phased_state, sliced


def _feedback_store(inner: str, precision: torch.dtype):
    """A stored copy with error feedback, by hand: y = S + e, stored = inner(y), e = precision(y - stored)."""
    fmt, e = get_format(inner), None

    def store(state):  # state [B, H, P, N] (any float dtype) -> the stored FP32 copy
        nonlocal e
        y = state.float() + (0.0 if e is None else e)
        stored = fmt.quantize(y)
        e = (y - stored).to(precision).float()
        return stored
    return store, lambda: e


@pytest.mark.parametrize("inner, precision", [("int8", torch.float32), ("int8:scale=head", torch.bfloat16),
                                              ("fp8:scale=tile:4x0,max=240", torch.float32)])
def test_mamba2_window_1_matches_hand_recurrence(inner, precision):
    """Conventional decoding (window 1) of Mamba-2 in FP64: S_t = exp(dt A) stored_{t-1} + dt x B^T, y = S_t C + D x,
    stored_t = inner(S_t + e), e = S_t + e - stored_t; the reference and the chunked form give the same outputs,
    stored states and residual."""
    x, dt, A, B, C, D, s0 = mamba2_inputs(batch=2, tokens=9, heads=2, head_dim=6, groups=1, d_state=10)
    cfg = inner + ("," if ":" in inner else ":") + f"ef={'fp32' if precision == torch.float32 else 'bf16'}"
    store, residual = _feedback_store(inner, precision)
    stored, ys = store(s0), []
    for t in range(x.shape[1]):
        decay = torch.exp(dt[:, t] * A)[..., None, None]  # [B, H, 1, 1]
        s = decay * stored.double() + (dt[:, t, :, None, None] * x[:, t, ..., None]) * B[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bn->bhp", s, C[:, t, 0]) + D[:, None] * x[:, t])
        stored = store(s)
    want = torch.stack(ys, 1)
    for fn in (mamba2.decode_reference, mamba2.chunked):
        y, st = fn(x, dt, A, B, C, D, s0, cfg, compute_dtype=torch.float64)
        assert_close(f"y of {fn.__name__}", want, y, 1e-12)
        assert torch.equal(st.hi, stored) and st.lo is st.hi
        assert list(st.residual) == [RECUR_COPY] and torch.equal(st.residual[RECUR_COPY], residual())
    # the feedback changes the stored states: without it they differ
    _, plain = mamba2.decode_reference(x, dt, A, B, C, D, s0, inner, compute_dtype=torch.float64)
    assert not torch.equal(plain.hi, stored) and plain.residual == {}


def test_gdn_window_1_matches_hand_recurrence():
    """GDN conventional decoding in FP64, by hand: S = exp(g) stored, u = beta (v - S^T k), S += k u^T, o = S^T q,
    stored = int8(S + e) on the formats' [HV, V, K] view, e = S + e - stored (FP32)."""
    q, k, v, g, beta, s0 = delta_inputs("gdn", batch=2, seqlen=7, heads=1, value_heads=2, dk=8, dv=6)
    store, residual = _feedback_store("int8", torch.float32)
    stored = store(s0.transpose(-1, -2)).transpose(-1, -2)  # [B, HV, K, V]
    outs = []
    for t in range(q.shape[1]):
        kt, qt = k[:, t].repeat_interleave(2, 1), q[:, t].repeat_interleave(2, 1)  # [B, HV, K]
        s = torch.exp(g[:, t])[..., None, None] * stored.double()
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", s, kt))
        s = s + kt[..., None] * u[..., None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", s, qt))
        stored = store(s.transpose(-1, -2)).transpose(-1, -2)
    fam = FAMILIES["gdn"]
    for fn in (fam.decode_reference, fam.chunked):
        o, st = fn(q, k, v, g, beta, s0, "int8:ef=fp32", compute_dtype=torch.float64)
        assert_close("o", torch.stack(outs, 1), o, 1e-12)
        assert torch.equal(st.hi, stored.transpose(-1, -2)) and torch.equal(st.residual[RECUR_COPY], residual())


def test_fp32_with_feedback_is_fp32_and_residuals_stay_zero():
    x, dt, A, B, C, D, s0 = mamba2_inputs(batch=2, tokens=6, dtype=torch.float32)
    y, st = mamba2.decode_reference(x, dt, A, B, C, D, s0, "fp32:ef=fp32/fp32@3")
    y_ref, ref = mamba2.decode_reference(x, dt, A, B, C, D, s0, "fp32/fp32@3")
    assert torch.equal(y, y_ref) and torch.equal(st.hi, ref.hi) and not st.residual[READ_COPY].any()


SPLIT = ["shared:int8:ef=fp32@4", "int8:scale=head,ef=bf16/fp16sr:ef=fp32@5", "fp8sr:ef=bf16/fp32@3#closed"]


@pytest.mark.parametrize("text", SPLIT)
def test_mamba2_chunked_matches_reference(text):
    """Sequences at different phases, each copy with its own residual, continued over two calls: the chunked form's
    outputs, stored copies, packed read copy and residuals are the reference's, bit for bit (FP64)."""
    cfg = ReplayConfig.parse(text).replace(gdn_fold="open")
    inputs = mamba2_inputs(batch=3, tokens=23)
    start = phased_state(mamba2.decode_reference, inputs, cfg, [0, 2, 5])
    ref = got = start
    for first, stop in ((0, 9), (9, 23)):
        part = sliced(inputs, first, stop)[:6]
        y_ref, ref = mamba2.decode_reference(*part, ref, cfg, compute_dtype=torch.float64)
        y, got = mamba2.chunked(*part, got, cfg, compute_dtype=torch.float64)
        assert_close("y", y_ref, y, 1e-10)
        assert_same_state(ref, got)
    assert set(ref.residual) == set(feedback_copies(cfg)) and all(t.abs().max() > 0 for t in ref.residual.values())


@pytest.mark.parametrize("fam", list(FAMILIES))
@pytest.mark.parametrize("text", SPLIT)
def test_delta_chunked_matches_reference(fam, text):
    inputs = delta_inputs(fam, seqlen=17)
    start = phased_start(fam, inputs, text)
    mod = FAMILIES[fam]
    o_ref, st_ref = mod.decode_reference(*cut(inputs, 0), start, text, compute_dtype=torch.float64)
    o, st = mod.chunked(*cut(inputs, 0), start, text, compute_dtype=torch.float64)
    assert_close("o", o_ref, o, 1e-10)
    assert_same_state(st_ref, st, buffer_rtol=1e-12, whole_buffer=True)


@pytest.mark.parametrize("fam", list(FAMILIES))
def test_speculative_reference_matches_step_reference(fam):
    """Speculative decoding with feedback (random acceptance, phased sequences): committed outputs, stored copies and
    residuals equal the step reference's (FP64)."""
    cfg = "int8:ef=fp32/fp16sr:ef=bf16@6#spec=3:0.7"
    inputs = delta_inputs(fam, seqlen=19)
    start = phased_start(fam, inputs, cfg, warmup=(0, 3, 4))
    mod = FAMILIES[fam]
    o_ref, st_ref = mod.decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    o, st = mod.speculative_decode_reference(*cut(inputs, 0), start, cfg, compute_dtype=torch.float64)
    assert_close("committed o", o_ref, o, 1e-12)
    assert torch.equal(st_ref.hi, st.hi) and torch.equal(st_ref.lo, st.lo)
    assert all(torch.equal(st_ref.residual[c], st.residual[c]) for c in (RECUR_COPY, READ_COPY))


@pytest.mark.parametrize("fam", ["mamba2", *FAMILIES])
def test_triton_steps_carry_the_residuals(fam, device):
    """Single-token Triton steps with error feedback from the FP32 anchor (checkpoint 0's packed read copy from zero
    residuals), folding every third step: outputs, stored copies and copies plus residuals those of the step
    reference in FP32, to FP32 summation noise; the packed read copy decodes to S_lo."""
    cfg = ReplayConfig.parse("int8:ef=fp32/fp16sr:ef=bf16@3")
    if fam == "mamba2":
        *inputs, s0 = (t.to(device) for t in mamba2_inputs(batch=2, tokens=7, dtype=torch.float32))
        step = lambda t, st: mamba2.decode_step(*sliced((*inputs, s0), t, t + 1)[:6], st, cfg)  # noqa: E731
        ref_step = lambda t, st: mamba2.decode_reference(*sliced((*inputs, s0), t, t + 1)[:6], st, cfg,  # noqa: E731
                                                         compute_dtype=torch.float32)
    else:
        *inputs, s0 = delta_inputs(fam, batch=2, seqlen=7, dtype=torch.float32, device=device)
        step = lambda t, st: FAMILIES[fam].decode_step_triton(*cut(inputs, t, t + 1), st, cfg)  # noqa: E731
        ref_step = lambda t, st: FAMILIES[fam].decode_reference(*cut(inputs, t, t + 1), st, cfg,  # noqa: E731
                                                                compute_dtype=torch.float32)
    st = ref = s0
    for t in range(7):
        out, st = step(t, st)
        out_ref, ref = ref_step(t, ref)
        assert_close(f"output {t}", out_ref, out, 1e-5, flips=0.01)
        for name, copy in (("hi", RECUR_COPY), ("lo", READ_COPY)):
            mostly_equal(f"{name} {t}", getattr(ref, name), getattr(st, name))
            # a flipped rounding moves the residual by the copy's step the other way: what the copy keeps, stored
            # value plus residual, stays within FP32 noise of the reference's
            mostly_equal(f"{name} + residual {t}", getattr(ref, name) + ref.residual[copy],
                         getattr(st, name) + st.residual[copy])
        assert torch.equal(cfg.read_format.decode(st.lo_packed), st.lo)
    assert torch.equal(st.checkpoint, torch.full_like(st.checkpoint, 2))
    assert all(t.abs().max() > 0 for t in st.residual.values())


def test_triton_paths_refuse_or_fall_back():
    x, dt, A, B, C, D, s0 = mamba2_inputs(batch=1, tokens=3, dtype=torch.float32)
    # a Mamba-2 copy with feedback that torch rounds between launches (a tensor-wide scale): the torch backend
    with pytest.warns(UserWarning, match="runs the torch backend.*error-feedback"):
        y, st = mamba2.chunked(x, dt, A, B, C, D, s0, "fp16/int8:scale=tensor,ef=fp32@1", backend="triton")
    y_ref, ref = mamba2.chunked(x, dt, A, B, C, D, s0, "fp16/int8:scale=tensor,ef=fp32@1")
    assert torch.equal(y, y_ref) and torch.equal(st.residual[RECUR_COPY], ref.residual[RECUR_COPY])
    q, k, v, g, beta, h0 = delta_inputs("gdn", batch=1, seqlen=1, dtype=torch.float32)
    # a delta-rule copy with feedback that torch rounds between launches (a tensor-wide scale): the torch backend
    with pytest.warns(UserWarning, match="runs the torch backend.*error-feedback"):
        o, st = FAMILIES["gdn"].chunked(q, k, v, g, beta, h0, "fp16/int8:scale=tensor,ef=fp32@1", backend="triton")
    o_ref, ref = FAMILIES["gdn"].chunked(q, k, v, g, beta, h0, "fp16/int8:scale=tensor,ef=fp32@1")
    assert torch.equal(o, o_ref) and torch.equal(st.residual[RECUR_COPY], ref.residual[RECUR_COPY])
    rule = FAMILIES["gdn"].RULE
    with pytest.raises(ValueError, match="do not carry the error-feedback residual of a copy torch rounds"):
        rule.chunk.chunked_triton(rule.prepare(q, k, v, g, beta, h0, "fp16/int8:scale=tensor,ef=fp32@1"))
    with pytest.raises(ValueError, match="keeps error-feedback residuals"):
        write_checkpoint(s0, ReplayConfig.parse("int8:ef=fp32"), 0, torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="keeps an error-feedback residual .* write_read_copy_packed was given none"):
        write_read_copy_packed(s0, ReplayConfig.parse("fp16:ef=bf16/fp32"), 0, torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="carries error-feedback residuals of copies \\[\\]"):
        mamba2.chunked(x, dt, A, B, C, D, mamba2.chunked(x, dt, A, B, C, D, s0, "fp32/int8@1")[1], "fp32/int8:ef=fp32@1")


def test_grammar_and_bytes():
    fmt = get_format("int8:ef=bf16,scale=head")
    assert fmt.name == "int8:scale=head,ef=bf16" and get_format(fmt.name) == fmt and fmt.feedback == "bf16"
    inner = get_format("int8:scale=head").kernel_codec  # the inner format's codec with the residual, its layout
    assert fmt.kernel_codec == dataclasses.replace(inner, ef=Residual.BF16)
    assert inner.packed and fmt.kernel_codec.packed and get_format("int8").feedback is None
    assert get_format("int8:scale=tensor,ef=fp32").kernel_codec.ef == Residual.FP32
    assert fmt.storage_bytes((2, 4, 8)) == get_format("int8:scale=head").storage_bytes((2, 4, 8)) + 2 * 64
    assert fmt.bits_per_element == 8 + 16 and get_format("nvfp4:ef=fp32").bits_per_element == 4.5 + 32
    assert ReplayConfig.parse("int8:ef=fp32@1").name == "int8:ef=fp32"
    x = torch.randn(2, 3, 4, 5)
    assert torch.equal(fmt.quantize(x), get_format("int8:scale=head").quantize(x))  # the rounding is the inner one's

"""`#buf=DTYPE`: the buffered inputs are rounded to the buffer dtype, the same way in every engine.

Mamba-2 rounds x and B (the D x term uses x as given); GDN rounds k and beta, and v with the closed fold.
"""

import pytest
import torch
import test_delta_reference as gdn_ref
import test_mamba2_reference as m2_ref

from replayssm_eval.kernels import gdn, mamba2
from replayssm_eval.kernels.config import ReplayConfig
from replayssm_eval.kernels.mamba2 import triton as m2_triton

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def _bf16(t):
    return t.to(torch.bfloat16).to(t.dtype)


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


@pytest.mark.parametrize("text", ["nvfp4/fp16sr@4", "shared:fp16@5#skip=0.3", "fp32"])
def test_mamba2_reference_equals_prerounded_inputs(text):
    """#buf=bf16 == an FP32 buffer fed bf16-rounded x and B, plus D (x - x_bf16) for the unrounded skip term."""
    x, dt, A, B, C, D, s0 = m2_ref.make_inputs(batch=2, tokens=11, heads=3, head_dim=5, groups=1, d_state=7,
                                               dtype=torch.float32)
    cfg = ReplayConfig.parse(text)
    y, st = mamba2.decode_reference(x, dt, A, B, C, D, s0, cfg.replace(buffer_dtype="bf16"))
    y_want, st_want = mamba2.decode_reference(_bf16(x), dt, A, _bf16(B), C, D, s0, cfg)
    y_want = y_want + D[:, None] * (x - _bf16(x))
    torch.testing.assert_close(y, y_want, rtol=1e-6, atol=1e-6)
    assert torch.equal(st.hi, st_want.hi)
    assert torch.equal(st.buffer["x"], _bf16(st.buffer["x"])) and torch.equal(st.buffer["B"], _bf16(st.buffer["B"]))
    y32, _ = mamba2.decode_reference(x, dt, A, B, C, D, s0, cfg)
    assert (y32 - y).abs().max() > 1e-4, "a bf16 buffer must change the outputs"


@pytest.mark.parametrize("fold", ["open", "closed"])
def test_gdn_reference_equals_prerounded_inputs(fold):
    q, k, v, g, beta, s0 = gdn_ref.make_inputs(batch=2, seqlen=9, heads=1, value_heads=2, dk=6, dv=5, dtype=torch.float32)
    cfg = ReplayConfig.parse("nvfp4/fp16sr@4").replace(gdn_fold=fold)
    o, st = gdn.decode_reference(q, k, v, g, beta, s0, cfg.replace(buffer_dtype="bf16"))
    v_want = _bf16(v) if fold == "closed" else v
    o_want, _ = gdn.decode_reference(q, _bf16(k), v_want, g, _bf16(beta), s0, cfg)
    assert torch.equal(o, o_want)
    assert torch.equal(st.buffer["k"], _bf16(st.buffer["k"]))
    o32, _ = gdn.decode_reference(q, k, v, g, beta, s0, cfg)
    assert (o32 - o).abs().max() > 1e-4, "a bf16 buffer must change the outputs"


@pytest.mark.parametrize("text", ["nvfp4/fp16sr@4#buf=bf16", "shared:fp8sr@3#buf=fp16#spec=2:0.6"])
def test_mamba2_chunked_matches_reference(text):
    inputs = m2_ref.make_inputs(batch=2, tokens=13, heads=3, head_dim=5, groups=3, d_state=7)
    y_ref, st_ref = mamba2.decode_reference(*inputs, text, compute_dtype=torch.float64)
    y, st = mamba2.chunked(*inputs, text, compute_dtype=torch.float64)
    m2_ref.assert_close("y", y_ref, y, 1e-10)
    assert torch.equal(st.hi, st_ref.hi) and torch.equal(st.lo, st_ref.lo)


@pytest.mark.parametrize("fold", ["open", "closed"])
def test_gdn_chunked_matches_reference(fold):
    inputs = gdn_ref.make_inputs(batch=2, seqlen=11, heads=1, value_heads=2, dk=6, dv=5)
    cfg = ReplayConfig.parse("nvfp4/fp16sr@4#buf=bf16").replace(gdn_fold=fold)
    o_ref, st_ref = gdn.decode_reference(*inputs, cfg, compute_dtype=torch.float64)
    o, st = gdn.chunked(*inputs, cfg, compute_dtype=torch.float64)
    gdn_ref.assert_close("o", o_ref, o, 1e-10)
    assert torch.equal(st.hi, st_ref.hi) and torch.equal(st.lo, st_ref.lo)


def test_mamba2_triton_matches_reference(device):
    """Chunked Triton, the single-token step and verify, against the reference with a bf16 buffer."""
    cfg = ReplayConfig.parse("nvfp4:scale=row/fp16sr@4#buf=bf16")
    inputs = tuple(t.to(device) for t in m2_ref.make_inputs(batch=2, tokens=7, heads=3, head_dim=5, groups=1,
                                                             d_state=7, dtype=torch.float32))
    y_ref, st_ref = mamba2.decode_reference(*inputs, cfg)
    y, _ = mamba2.chunked(*inputs, cfg, backend="triton")
    m2_ref.assert_close("chunked triton", y_ref, y, 1e-5, flips=0.02)
    x, dt, A, B, C, D, state = inputs
    ys = []
    for n in range(x.shape[1]):
        y_n, state = m2_triton.decode_step_triton(x[:, n], dt[:, n], A, B[:, n], C[:, n], D, state, cfg)
        ys.append(y_n)
    m2_ref.assert_close("decode step", y_ref, torch.stack(ys, 1), 1e-5, flips=0.02)
    assert torch.equal(state.buffer["x"], _bf16(state.buffer["x"]))
    spec = cfg.replace(speculative=ReplayConfig.parse("fp32#spec=3:0.5").speculative, window=8)
    _, committed = mamba2.decode_reference(*m2_ref.sliced(inputs, 0, 2)[:6], inputs[6], spec)
    drafts = m2_ref.sliced(inputs, 2, 5)[:6]
    out = m2_triton.verify_triton(*drafts, committed, spec)
    y_drafts, _ = mamba2.decode_reference(*drafts, committed, spec.replace(window=16, speculative=None))
    m2_ref.assert_close("verify", y_drafts, out, 1e-5)


@pytest.mark.parametrize("fold", ["open", "closed"])
def test_gdn_triton_matches_reference(fold, device):
    cfg = ReplayConfig.parse("nvfp4:scale=row/fp16sr@4#buf=bf16").replace(gdn_fold=fold)
    inputs = gdn_ref.make_inputs(batch=2, seqlen=7, heads=1, value_heads=2, dk=6, dv=5, dtype=torch.float32,
                                 device=device)
    o_ref, _ = gdn.decode_reference(*inputs, cfg)
    o, _ = gdn.chunked(*inputs, cfg, backend="triton")
    gdn_ref.assert_close("chunked triton", o_ref, o, 2e-3)
    state, outs = inputs[5], []
    for n in range(inputs[0].shape[1]):
        o_n, state = gdn.decode_step_triton(*gdn_ref.cut(inputs, n, n + 1), state, cfg)
        outs.append(o_n)
    gdn_ref.assert_close("decode step", o_ref, torch.cat(outs, 1), 2e-3)
    assert torch.equal(state.buffer["k"], _bf16(state.buffer["k"]))

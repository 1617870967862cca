"""GDN Triton kernels against the torch reference (TRITON_INTERPRET=1 on CPU; tests/conftest.py sets it).

FP32 compute in two different orders can put a value on either side of a rounding midpoint, so
with quantized formats the stored states are compared for (nearly all) identical elements and
the outputs loosely; the in-kernel rounding itself is checked bit for bit on its own. (The Philox
key must reach `tl.randint` as a loaded int64, as the kernels do: a Python-int kernel argument
gave different bits in the interpreter.)
"""

import pytest
import torch
import triton
import triton.language as tl
from test_gdn_reference import assert_close, cut, make_inputs, phased_start

from replayssm_eval.kernels.config import ReplayConfig
from replayssm_eval.kernels.gdn import chunked, decode_reference
from replayssm_eval.kernels.gdn import triton as gdn_triton
from replayssm_eval.kernels.gdn.reference import _verify
from replayssm_eval.kernels.state import write_checkpoint

SMALL = dict(batch=2, heads=2, value_heads=4, dk=20, dv=24)


@triton.jit
def _round_tile_kernel(x_ptr, y_ptr, key_ptr, checkpoint_ptr, HV, K, V, KIND: tl.constexpr, SCALE: tl.constexpr,
                       FMT_MAX: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    hv = tl.program_id(0)
    ks = tl.arange(0, BK)
    vs = tl.arange(0, BV)
    mask = (ks[:, None] < K) & (vs[None, :] < V)
    elem = (hv * V + vs[None, :]).to(tl.int64) * K + ks[:, None]
    x = tl.load(x_ptr + elem, mask=mask, other=0.0)
    y = gdn_triton._store_round(x, tl.load(key_ptr), tl.load(checkpoint_ptr), elem, KIND, SCALE, FMT_MAX, BK, BV)
    tl.store(y_ptr + elem, y, mask=mask)


@pytest.mark.parametrize("spec", ["fp16", "fp16sr", "bf16", "fp8", "fp8sr", "fp8:scale=head", "fp8e5m2:scale=none",
                                  "nvfp4:scale=row", "nvfp4:scale=head"])
def test_in_kernel_rounding_is_bit_exact(spec):
    """`_store_round` inside a kernel == write_checkpoint (fmt.quantize with the Philox bits of `kernels.keys`)."""
    cfg = ReplayConfig(read=spec, recur=spec, window=4, seed=7)
    x = torch.randn(1, 3, 24, 40) * torch.logspace(-3, 2, 40)  # [B, HV, V, K], rows of mixed magnitude
    x[0, 1, 3] = 0.0
    kind, scale, top = gdn_triton._store_mode(cfg.recur_format, whole_head=True)
    y = torch.empty_like(x)
    key = gdn_triton.sr_keys(7, 2, torch.tensor([5]), 0)  # [1] int64, loaded in-kernel as the chunked kernel does
    _round_tile_kernel[(3,)](x, y, key, torch.tensor([9]), 3, 40, 24, KIND=kind, SCALE=scale, FMT_MAX=top, BK=64, BV=32)
    want, _ = write_checkpoint(x, cfg, 2, torch.tensor([5]), torch.tensor([9]))
    assert torch.equal(y, want), f"{spec}: {(y != want).sum().item()} of {y.numel()} elements differ"


def _mostly_equal(name, ref, got, fraction=0.98):
    """All but a few elements equal to FP32 noise (a global scale's amax one ulp apart moves a whole row by an ulp);
    the rest are rounding decisions that flipped."""
    close = ((got - ref).abs() <= 1e-5 * ref.abs().max()).float().mean().item()
    assert close >= fraction, f"{name}: only {close:.1%} of elements agree"


@pytest.mark.parametrize("text", ["fp32/fp32@4", "fp32/fp32@4#closed#skip=0.7", "fp32/fp32@5#spec=3:0.6#closed"])
def test_chunked_triton_fp32(text):
    inputs = make_inputs(seqlen=21, dtype=torch.float32, **SMALL)
    start = phased_start(inputs, text, warmup=(0, 3), dtype=torch.float32)
    o_ref, st_ref = decode_reference(*cut(inputs, 0), start, text)
    o, st = chunked(*cut(inputs, 0), start, text, backend="triton")
    assert_close("o", o_ref, o, 1e-5)
    assert_close("S_hi", st_ref.hi, st.hi, 1e-5)
    for name in st_ref.buffer:
        assert_close(f"buffer[{name!r}]", st_ref.buffer[name], st.buffer[name], 1e-5)
    assert torch.equal(st_ref.checkpoint, st.checkpoint)


@pytest.mark.parametrize("text", ["nvfp4:scale=row/fp16sr@4#closed", "shared:nvfp4:scale=head@8", "fp8sr/fp16@4"])
def test_chunked_triton_quantized(text):
    inputs = make_inputs(seqlen=13, dtype=torch.float32, **SMALL)
    o_ref, st_ref = chunked(*inputs, text)
    o, st = chunked(*inputs, text, backend="triton")
    assert_close("o", o_ref, o, 2e-3)
    _mostly_equal("S_hi", st_ref.hi, st.hi)
    _mostly_equal("S_lo", st_ref.lo, st.lo)


def test_chunked_triton_falls_back_with_reason():
    inputs = make_inputs(seqlen=5, dtype=torch.float32, **SMALL)
    with pytest.warns(UserWarning, match="global scale spans every head"):
        o, _ = chunked(*inputs, "nvfp4/fp32@4", backend="triton")
    assert_close("o", chunked(*inputs, "nvfp4/fp32@4")[0], o, 1e-6)
    with pytest.raises(ValueError, match="backend='triton' computes in FP32"):
        chunked(*inputs, "fp32", backend="triton", compute_dtype=torch.float64)


@pytest.mark.parametrize("text, exact", [("fp32/fp32@3#closed", True), ("nvfp4/fp16sr@4", False), ("shared:fp8sr@3#skip=0.8", False)])
def test_decode_step_triton(text, exact):
    """Token by token through the step kernel (packed read copy on non-flush steps) == decode_reference."""
    inputs = make_inputs(seqlen=6, dtype=torch.float32, **SMALL)
    o_ref, st_ref = decode_reference(*inputs, text)
    state, outs = inputs[5], []
    for n in range(6):
        o, state = gdn_triton.decode_step_triton(*cut(inputs, n, n + 1), state, text)
        outs.append(o)
    assert_close("o", o_ref, torch.cat(outs, 1), 1e-5 if exact else 2e-3)
    if exact:
        assert_close("S_hi", st_ref.hi, state.hi, 1e-5)
    else:
        _mostly_equal("S_hi", st_ref.hi, state.hi)
        _mostly_equal("S_lo", st_ref.lo, state.lo)
    assert_close("buffer u", st_ref.buffer["u"], state.buffer["u"], 2e-3)
    fmt = gdn_triton._read_format(ReplayConfig.parse(text))
    assert torch.equal(fmt.decode(state.lo_packed), state.lo), "lo_packed must decode to the stored read copy"


def test_verify_triton():
    """Speculative verification kernel == the reference's output-only verification, per sequence."""
    cfg = ReplayConfig.parse("nvfp4/fp32@8#spec=4:0.5")
    inputs = make_inputs(seqlen=7, dtype=torch.float32, **SMALL)
    st = inputs[5]
    for n in range(3):  # committed entries and a packed read copy, from the step kernel
        _, st = gdn_triton.decode_step_triton(*cut(inputs, n, n + 1), st, cfg)
    drafts = dict(zip(("q", "k", "v", "g", "beta"), cut(inputs, 3, 7)))
    width = torch.tensor([4, 3])
    read_hi = torch.tensor([False, True])
    u, o = gdn_triton.verify_triton(st.hi, st.lo_packed, cfg.read_format, st.buffer, st.schedule.count, drafts, width, read_hi, groups=2)
    for b in range(2):
        ring = {name: t[b].clone() for name, t in st.buffer.items()}
        h, w = int(st.schedule.count[b]), int(width[b])
        ring["k"][h:h + w] = drafts["k"][b, :w]
        ring["g"][h:h + w] = drafts["g"][b, :w]
        src = (st.hi if read_hi[b] else st.lo)[b].transpose(-1, -2)
        q = drafts["q"][b, :w].repeat_interleave(2, 1)
        u_ref, o_ref = _verify(src, ring, h, w, q, drafts["v"][b, :w], drafts["beta"][b, :w], 2, None)
        assert_close(f"u[{b}]", u_ref, u[b, :w], 1e-5)
        assert_close(f"o[{b}]", o_ref, o[b, :w], 1e-5)

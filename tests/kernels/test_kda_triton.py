"""KDA Triton kernels against the torch reference (TRITON_INTERPRET=1 on CPU; tests/conftest.py sets it), on the
device under test (`REPLAYSSM_TEST_DEVICE=cuda` runs the compiled kernels).

FP32 compute in two different orders can put a value on either side of a rounding midpoint, so with quantized
formats the stored states are compared for (nearly all) identical elements and the outputs loosely. The in-kernel
rounding is Gated DeltaNet's (`gdn.triton._store_round`), checked bit for bit in test_gdn_triton.py.
"""

import sys
from unittest import mock

import pytest
import torch
from test_kda_reference import assert_close, cut, make_inputs, phased_start, plain_recurrence

from replayssm_eval.kernels.config import ReplayConfig
from replayssm_eval.kernels.kda import chunked, decode_reference
from replayssm_eval.kernels.kda import triton as kda_triton
from replayssm_eval.kernels.kda._common import _prepare, to_format_layout
from replayssm_eval.kernels.kda.reference import _verify
from replayssm_eval.kernels.state import write_checkpoint

SMALL = dict(batch=2, heads=1, value_heads=2, dk=20, dv=12)
AWKWARD = dict(heads=1, value_heads=2, dk=24, dv=40)  # grouped heads (HV = 2H), K and V not powers of two


def _mostly_equal(name, ref, got, fraction=0.98):
    """All but a few elements equal to FP32 noise; the rest are rounding decisions that flipped."""
    close = ((got - ref).abs() <= 1e-5 * ref.abs().max()).float().mean().item()
    assert close >= fraction, f"{name}: only {close:.1%} of elements agree"


def _one_segment_launches():
    """Every `_chunked_kernel` launch runs one segment (SEGS=1)."""
    return mock.patch.object(sys.modules["replayssm_eval.kernels.kda.triton"], "_BLOCK_ELEMENTS", 1)


@pytest.mark.parametrize("text", ["fp32/fp32@4", "fp32/fp32@4#closed#skip=0.7", "fp32/fp32@5#spec=3:0.6#closed"])
def test_chunked_triton_fp32(text, device):
    """Per-sequence phases from carried buffers: == decode_reference to FP32 accuracy."""
    inputs = make_inputs(seqlen=13, dtype=torch.float32, device=device, **SMALL)
    start = phased_start(inputs, text, warmup=(0, 3), dtype=torch.float32)
    o_ref, st_ref = decode_reference(*cut(inputs, 0), start, text)
    o, st = chunked(*cut(inputs, 0), start, text, backend="triton")
    assert_close("o", o_ref, o, 1e-5)
    assert_close("S_hi", st_ref.hi, st.hi, 1e-5)
    for name in st_ref.buffer:
        assert_close(f"buffer[{name!r}]", st_ref.buffer[name], st.buffer[name], 1e-5)
    assert torch.equal(st_ref.checkpoint, st.checkpoint)


@pytest.mark.parametrize("text", ["nvfp4:scale=row/fp16sr@4#closed", "shared:nvfp4:scale=tensor@4", "fp8sr/fp16@3#skip=0.6"])
def test_chunked_triton_quantized(text, device):
    """In-kernel rounding (row scales, fp16sr, fp8sr) and torch-rounded copies (a tensor-wide NVFP4 scale): == the torch
    chunked form; awkward sizes (V = 40 in two v-blocks) with one segment per launch."""
    inputs = make_inputs(batch=2, seqlen=10, dtype=torch.float32, device=device, **AWKWARD)
    o_ref, st_ref = chunked(*inputs, text)
    with _one_segment_launches(), mock.patch.object(kda_triton, "chunked_launch_config",
                                                    lambda *a: {"BV": 32, "num_warps": 4, "DOT": "ieee"}):
        o, st = chunked(*inputs, text, backend="triton")
    assert_close("o", o_ref, o, 2e-3)
    _mostly_equal("S_hi", st_ref.hi, st.hi)
    _mostly_equal("S_lo", st_ref.lo, st.lo)
    assert torch.equal(st_ref.checkpoint, st.checkpoint)


def test_chunked_triton_unrounded_folds_round_to_stored(device):
    """rounded=False gives the kernel's FP32 folds; `write_checkpoint` of them is exactly what rounded=True stores."""
    cfg = ReplayConfig.parse("nvfp4:scale=row/fp16sr@4")
    inputs = make_inputs(seqlen=4, dtype=torch.float32, device=device, **SMALL)
    prep = lambda: _prepare(*inputs, cfg, layer_idx=0, seq_ids=None, compute_dtype=torch.float32)  # noqa: E731
    _, rounded = kda_triton.chunked_triton(prep())
    _, fold = kda_triton.chunked_triton(prep(), rounded=False)
    hi, lo = write_checkpoint(fold.hi.cpu(), cfg, 0, rounded.seq_ids.cpu(), rounded.checkpoint.cpu())
    assert torch.equal(hi, rounded.hi.cpu()) and torch.equal(lo, rounded.lo.cpu())


def test_chunked_triton_refuses_fp64(device):
    inputs = make_inputs(seqlen=3, dtype=torch.float32, device=device, **SMALL)
    with pytest.raises(ValueError, match="backend='triton' computes in FP32"):
        chunked(*inputs, "fp32", backend="triton", compute_dtype=torch.float64)


@pytest.mark.parametrize("text, exact, phased", [
    ("fp32/fp32@3#closed", True, True), ("fp32/fp32@3#skip=0.7", True, True), ("nvfp4/fp16sr@4", False, True),
    ("nvfp4:scale=row/fp32@3#closed", True, False), ("shared:fp8sr@3#skip=0.8", False, False), ("fp8/fp32@4#spec=2:0.6", True, False),
    ("fp32/fp32@3#closed#buf=bf16", True, True),
])
def test_decode_step_triton(text, exact, phased, device):
    """Token by token through the single-token kernel (packed read copy on non-flush steps) == decode_reference,
    awkward sizes; phased: sequences at different phases (folding and reading sequences in one launch) from a state
    whose read copy re-encodes exactly (row-scaled NVFP4 and SR copies do not: they start from the FP32 state)."""
    cfg = ReplayConfig.parse(text)
    inputs = make_inputs(batch=2, seqlen=7, dtype=torch.float32, device=device, **AWKWARD)
    start = phased_start(inputs, cfg, warmup=(0, 1), dtype=torch.float32) if phased else inputs[5]
    o_ref, st_ref = decode_reference(*cut(inputs, 0, 5), start, cfg)
    state, outs = start, []
    for n in range(5):
        o, state = kda_triton.decode_step_triton(*cut(inputs, n, n + 1), state, cfg)
        outs.append(o)
    assert_close("o", o_ref, torch.cat(outs, 1), 1e-5 if exact else 2e-3)
    if exact:
        assert_close("S_hi", st_ref.hi, state.hi, 1e-5)
    else:
        _mostly_equal("S_hi", st_ref.hi, state.hi)
        _mostly_equal("S_lo", st_ref.lo, state.lo)
    assert torch.equal(st_ref.checkpoint, state.checkpoint) and int(state.checkpoint.min()) >= 1
    assert_close("buffer u", st_ref.buffer["u"], state.buffer["u"], 1e-5 if exact else 2e-3)
    fmt = kda_triton._read_format(cfg)
    assert torch.equal(fmt.decode(state.lo_packed), state.lo), "lo_packed must decode to the stored read copy"


def test_verify_triton(device):
    """Speculative verification kernel == the reference's output-only verification, per sequence."""
    cfg = ReplayConfig.parse("nvfp4/fp32@8#spec=4:0.5#skip=0.6")
    inputs = make_inputs(seqlen=7, dtype=torch.float32, device=device, **SMALL)
    st = inputs[5]
    for n in range(3):  # committed entries and a packed read copy, from the step kernel
        _, st = kda_triton.decode_step_triton(*cut(inputs, n, n + 1), st, cfg)
    drafts = dict(zip(("q", "k", "v", "g", "beta"), cut(inputs, 3, 7)))
    width = torch.tensor([4, 3], device=device)
    read_hi = torch.tensor([False, True], device=device)
    u, o = kda_triton.verify_triton(st.hi, st.lo_packed, cfg.read_format, st.buffer, st.schedule.count, drafts, width,
                                    read_hi, groups=2, eps=0.6)
    for b in range(2):
        ring = {name: t[b].clone() for name, t in st.buffer.items()}
        h, w = int(st.schedule.count[b]), int(width[b])
        ring["k"][h:h + w] = drafts["k"][b, :w]
        ring["g"][h:h + w] = drafts["g"][b, :w]
        src = (st.hi if read_hi[b] else st.lo)[b].transpose(-1, -2)
        q = drafts["q"][b, :w].repeat_interleave(2, 1)
        u_ref, o_ref = _verify(src, ring, h, w, q, drafts["v"][b, :w], drafts["beta"][b, :w], 2, 0.6)
        assert_close(f"u[{b}]", u_ref, u[b, :w], 1e-5)
        assert_close(f"o[{b}]", o_ref, o[b, :w], 1e-5)


def test_conventional_step(device):
    """The fused FP32 eager step == the plain recurrence, token by token, state updated in place."""
    inputs = make_inputs(batch=2, seqlen=3, dtype=torch.float32, device=device, **AWKWARD)
    want, want_state = plain_recurrence(inputs)
    state = to_format_layout(inputs[5]).contiguous()
    outs = []
    for n in range(3):
        q, k, v, g, beta = (t[:, n].contiguous() for t in inputs[:5])
        outs.append(kda_triton.conventional_step(q, k, v, g, beta, state))
    assert_close("o", want, torch.stack(outs, 1), 1e-5)
    assert_close("state", want_state, state.transpose(-1, -2), 1e-5)


def test_verify_family_convention(device):
    """`verify` (KernelFamily convention) from a state at a step boundary, every draft accepted: the drafts' outputs
    are the committed outputs of decode_reference."""
    cfg = "nvfp4/fp32@8#spec=4:1"
    inputs = make_inputs(seqlen=8, dtype=torch.float32, device=device, **SMALL)
    o_ref, _ = decode_reference(*inputs, cfg)
    state = inputs[5]
    for n in range(4):
        _, state = kda_triton.decode_step_triton(*cut(inputs, n, n + 1), state, cfg)
    assert state.schedule.step_left.tolist() == [0, 0] and state.schedule.count.tolist() == [4, 4]
    o = kda_triton.verify(*cut(inputs, 4, 8), state, cfg)
    assert_close("o", o_ref[:, 4:8], o, 1e-5)

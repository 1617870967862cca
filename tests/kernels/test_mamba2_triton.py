"""Mamba-2 Triton kernels against the torch reference (TRITON_INTERPRET=1 on CPU, see tests/conftest.py).

Tolerances: the kernels sum in FP32 in their own order (tl.dot, tl.cumsum), so outputs match the
reference to ~1e-6 relative; a state within an ulp of a rounding boundary may round the other way
(see `assert_close`). The in-loop quantizers themselves are checked bit for bit: the copies the
kernel rounds must equal the quant library's rounding of the kernel's own FP32 fold.
"""

import dataclasses
import warnings

import pytest
import torch
from test_mamba2_reference import assert_close, make_inputs, phased_state, sliced

from replayssm_eval.kernels.config import ReplayConfig
from replayssm_eval.kernels.mamba2 import chunked, decode_reference
from replayssm_eval.kernels.mamba2.triton import decode_step_triton, verify_triton

# the interpreter reports 1/0 in numpy; the kernels handle it as the formats specify (FLT_MAX clamps)
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def _small(**kw):
    return make_inputs(**{"batch": 2, "tokens": 13, "heads": 3, "head_dim": 20, "d_state": 24, "dtype": torch.float32,
                          "seed": 3, **kw})


@pytest.mark.parametrize("text, groups", [
    ("shared:fp16sr@1", 1),
    ("shared:nvfp4:scale=row@4#skip=0.4", 3),
    ("nvfp4:scale=head/fp8sr@4", 1),
    ("fp16/fp8sr:scale=head@8#spec=3:0.6", 3),
])
def test_chunked_triton_matches_torch(text, groups, device):
    config = ReplayConfig.parse(text)
    inputs = tuple(t.to(device) for t in _small(groups=groups))
    state = phased_state(decode_reference, tuple(t.cpu() for t in inputs), config, [0, 3], torch.float32)
    state = dataclasses.replace(state, **{f: getattr(state, f).to(device) for f in ("hi", "lo", "checkpoint", "seq_ids")},
                                buffer={k: v.to(device) for k, v in state.buffer.items()},
                                schedule=type(state.schedule)(*(getattr(state.schedule, f).to(device) for f in
                                                                ("count", "step_left", "step_read_hi", "steps"))))
    main = sliced(inputs, 3, 13)[:6]
    y_ref, st_ref = chunked(*main, state, config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y, st = chunked(*main, state, config, backend="triton")
    assert not [w for w in caught if "runs the torch backend" in str(w.message)], "these formats must run in the kernel"
    assert_close("y", y_ref, y, 1e-5, flips=0.01)
    assert_close("hi", st_ref.hi, st.hi, 1e-5, flips=0.01)
    assert_close("lo", st_ref.lo, st.lo, 1e-5, flips=0.01)
    assert torch.equal(st.checkpoint, st_ref.checkpoint) and st.checkpoint.min() >= 1
    # bit-exact in-loop quantization: the packed read copy is the quant library's rounding of the kernel's fold
    assert torch.equal(config.read_format.decode(st.lo_packed), st.lo)
    if config.shared:
        assert torch.equal(st.hi, st.lo)


def test_chunked_triton_falls_back_with_reason():
    inputs = _small(tokens=6)
    with pytest.warns(UserWarning, match="tensor-wide scale"):
        y, st = chunked(*inputs, "nvfp4/fp16sr@4", backend="triton")
    y_ref, st_ref = chunked(*inputs, "nvfp4/fp16sr@4")
    assert torch.equal(y, y_ref) and torch.equal(st.hi, st_ref.hi)


@pytest.mark.parametrize("text", ["nvfp4/fp16sr@4", "nvfp4:scale=row/fp32@3", "fp8/fp16sr@4#skip=0.3", "fp16/fp32@2"])
def test_decode_step_matches_reference(text, device):
    """Steps from sequences at different phases: non-flush steps read the packed read copy, flush steps fold."""
    config = ReplayConfig.parse(text)
    inputs = tuple(t.to(device) for t in _small(batch=3, groups=3))
    state = phased_state(decode_reference, inputs, config, [0, 1, 2], torch.float32)
    x, dt, A, B, C, D, _ = inputs
    tri, ref = state, state
    for n in range(2, 9):
        y_ref, ref = decode_reference(*sliced(inputs, n, n + 1)[:6], ref, config)
        y, tri = decode_step_triton(x[:, n], dt[:, n], A, B[:, n], C[:, n], D, tri, config)
        assert_close(f"y[{n}]", y_ref[:, 0], y, 1e-5, flips=0.01)
    assert_close("hi", ref.hi, tri.hi, 1e-5, flips=0.01)
    assert torch.equal(config.read_format.decode(tri.lo_packed), tri.lo)
    assert torch.equal(tri.checkpoint, ref.checkpoint) and tri.checkpoint.min() >= 1


@pytest.mark.parametrize("read_hi", [False, True])
def test_verify_matches_reference(read_hi, device):
    """O for T = 3 drafts after h committed entries equals step decoding of the drafts without a flush."""
    config = ReplayConfig.parse("nvfp4/fp16sr@8#spec=3:0.5")
    inputs = tuple(t.to(device) for t in _small(batch=3, groups=1, tokens=10))
    state = phased_state(decode_reference, inputs, config, [2, 4, 5], torch.float32)
    assert not state.checkpoint.any(), "no flush before the drafts: the test reads checkpoint 0"
    sched = state.schedule
    state = dataclasses.replace(state, schedule=type(sched)(sched.count, sched.step_left,
                                                            torch.full_like(sched.step_read_hi, read_hi), sched.steps))
    drafts = sliced(inputs, 5, 8)[:6]
    out = verify_triton(*drafts, state, config)
    expect_state = dataclasses.replace(state, lo=state.hi, lo_packed=None) if read_hi else state
    y_ref, _ = decode_reference(*drafts, expect_state, config.replace(window=16, speculative=None))
    assert_close("O", y_ref, out, 1e-5)

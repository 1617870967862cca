"""The Mamba-2 step reference against an independent naive recurrence (`tests.helpers.mamba2`), eager decoding, and
bad input.
"""

import pytest
import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.mamba2 import chunked, decode_reference, speculative_decode_reference
from replayssm_eval.replay.state import write_checkpoint

from tests.helpers.compare import assert_close
from tests.helpers.mamba2 import mamba2_inputs, naive_mamba2_decode, phased_state, sliced
from tests.helpers.replay import CONFIGS, WINDOWS


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("text", CONFIGS)
def test_reference_matches_naive(text, window):
    """Awkward T = 37 in two calls, sequences at different phases, FP64: same outputs and identical checkpoints."""
    config = ReplayConfig.parse(f"{text}@{window}")
    inputs = mamba2_inputs()
    pre = [0, 5, 11]
    state = phased_state(decode_reference, inputs, config, pre)
    if window > 1:
        assert len(set(state.schedule.count.tolist())) > 1, "the phases must differ"
    # sequences b decode tokens pre[b]..36 in this call: shift each sequence's tokens
    def shift(t):
        return torch.stack([torch.cat([t[b, pre[b]:], t[b, :pre[b]]]) for b in range(t.shape[0])])[:, :26]
    x, dt, A, B, C, D, _ = inputs
    y, final = decode_reference(shift(x), shift(dt), A, shift(B), shift(C), D, state, config,
                                compute_dtype=torch.float64)
    for b in range(3):
        y_naive, (hi, lo) = naive_mamba2_decode(sliced(inputs, 0, pre[b] + 26), config, b)
        assert_close(f"y[{b}]", y_naive[pre[b]:], y[b], 1e-12)
        assert torch.equal(final.hi[b], hi) and torch.equal(final.lo[b], lo), f"checkpoints of sequence {b} differ"


@pytest.mark.parametrize("text", ["shared:nvfp4@1", "nvfp4/fp16sr@4", "fp16/fp32@16"])
def test_reference_fp32_compute_matches_naive(text):
    config = ReplayConfig.parse(text)
    inputs = mamba2_inputs(batch=2, tokens=21, heads=2, head_dim=5, groups=1, d_state=16, dtype=torch.float32)
    y, _ = decode_reference(*inputs, config)
    for b in range(2):
        y_naive, _ = naive_mamba2_decode(inputs, config, b)
        assert_close(f"y[{b}]", y_naive, y[b], 2e-5)


@pytest.mark.parametrize("text", ["shared:nvfp4@4#skip=0.3", "nvfp4/fp8sr@8#skip=0.5"])
def test_skip_read_below(text):
    """Skipping the checkpoint term of heads whose decay since the checkpoint is small: naive == reference, and it changes y."""
    config = ReplayConfig.parse(text)
    inputs = mamba2_inputs(batch=2, tokens=19)
    y, _ = decode_reference(*inputs, config, compute_dtype=torch.float64)
    y_full, _ = decode_reference(*inputs, config.replace(skip_read_below=None), compute_dtype=torch.float64)
    assert (y - y_full).abs().max() > 1e-3, "no head was skipped: the test would not see a wrong skip rule"
    for b in range(2):
        y_naive, _ = naive_mamba2_decode(inputs, config, b)
        assert_close(f"y[{b}]", y_naive, y[b], 1e-12)


@pytest.mark.parametrize("fmt", ["fp16", "fp16sr", "fp8sr", "nvfp4", "bf16"])
def test_window_one_is_eager_decoding(fmt):
    """L = 1, shared: y from the unrounded updated state, the stored state rounded every step."""
    config = ReplayConfig.parse(f"{fmt}@1#seed=7")
    inputs = mamba2_inputs(batch=2, tokens=13, groups=1)
    x, dt, A, B, C, D, s0 = inputs
    y, final = decode_reference(*inputs, config, seq_ids=[4, 9], compute_dtype=torch.float64)
    ids = torch.tensor([4, 9])
    S, _ = write_checkpoint(s0, config, 0, ids, torch.zeros(2, dtype=torch.int64))
    for t in range(x.shape[1]):
        a = torch.exp(dt[:, t] * A)  # [B, H]
        S_new = a[..., None, None] * S.double() + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :1, None, :]
        assert_close(f"y[:, {t}]", torch.einsum("bhpn,bn->bhp", S_new, C[:, t, 0]) + D[:, None] * x[:, t], y[:, t], 1e-12)
        S, _ = write_checkpoint(S_new, config, 0, ids, torch.full((2,), t + 1))
    assert torch.equal(final.hi, S) and final.checkpoint.tolist() == [13, 13]


def test_stochastic_rounding_is_keyed_by_seed():
    inputs = mamba2_inputs(batch=2, tokens=9)
    run = lambda text: decode_reference(*inputs, text, compute_dtype=torch.float64)[1].hi  # noqa: E731
    assert torch.equal(run("nvfp4/fp16sr@4#seed=3"), run("nvfp4/fp16sr@4#seed=3"))
    assert not torch.equal(run("nvfp4/fp16sr@4#seed=3"), run("nvfp4/fp16sr@4#seed=4"))


def test_returned_state():
    inputs = mamba2_inputs(batch=2, tokens=10)
    y, st = decode_reference(*inputs, "nvfp4/fp8sr@4", compute_dtype=torch.float64)
    assert y.dtype == torch.float64 and y.shape == inputs[0].shape
    assert st.checkpoint.tolist() == [2, 2] and st.schedule.count.tolist() == [2, 2]
    assert st.buffer["x"].shape == (2, 4, 3, 20) and st.buffer["B"].shape == (2, 4, 3, 24) and st.buffer["dt"].shape == (2, 4, 3)
    assert torch.equal(st.buffer["x"][:, :2], inputs[0][:, 8:])
    assert torch.equal(ReplayConfig.parse("nvfp4/fp8sr").read_format.decode(st.lo_packed), st.lo)
    assert st.lo_packed.data.dtype == torch.uint8


def _bad_input_cases():
    x, dt, A, B, C, D, s0 = mamba2_inputs(batch=2, tokens=5, dtype=torch.float32)
    ok = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, initial_state=s0, config="nvfp4/fp16sr@4")
    meta = lambda t: torch.empty(t.shape, device="meta")  # noqa: E731
    return [
        (dict(x=x[0]), "x has shape"),
        (dict(dt=dt[:, :4]), "dt has shape"),
        (dict(A=A[:2]), "A has shape"),
        (dict(B=B[:, :, :2], C=C[:, :, :2]), "B has 2 groups"),
        (dict(C=C[..., :8]), "C has shape"),
        (dict(D=D[None]), "D has shape"),
        (dict(x=x.to(torch.int32)), "x has dtype"),
        (dict(dt=meta(dt)), "dt is on meta"),
        (dict(initial_state=s0[:, :, :3]), "initial_state has shape"),
        (dict(config="nvfp5/fp32"), "unknown state format 'nvfp5'"),
        (dict(config="nvfp4/fp32@0"), "window must be"),
        (dict(config=16), "config must be a ReplayConfig"),
        (dict(seq_ids=[0, 1, 2]), "seq_ids must be 2 integers"),
        (dict(compute_dtype=torch.float16), "compute_dtype must be"),
        (dict(layer_idx=-1), "layer_idx must be"),
    ], ok


@pytest.mark.parametrize("fn", [decode_reference, chunked, speculative_decode_reference])
def test_bad_input(fn):
    cases, ok = _bad_input_cases()
    for change, message in cases:
        args = {**ok, **change}
        if fn is speculative_decode_reference and "config" not in change:
            args["config"] = "nvfp4/fp16sr@4#spec=2:0.5"
        kwargs = {k: args.pop(k) for k in ("seq_ids", "compute_dtype", "layer_idx") if k in args}
        with pytest.raises(ValueError, match=message):
            fn(*args.values(), **kwargs)


def test_bad_state_and_backend():
    inputs = mamba2_inputs(batch=2, tokens=5, dtype=torch.float32)
    _, st = decode_reference(*inputs, "nvfp4/fp16sr@4", layer_idx=3)
    cont = (*inputs[:6], st, "nvfp4/fp16sr@4")
    with pytest.raises(ValueError, match="belongs to layer 3"):
        decode_reference(*cont)
    with pytest.raises(ValueError, match="differ from initial_state.seq_ids"):
        decode_reference(*cont, layer_idx=3, seq_ids=[5, 6])
    with pytest.raises(ValueError, match="read copy is in 'nvfp4'"):
        decode_reference(*inputs[:6], st, "fp16/fp32@4", layer_idx=3)
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        chunked(*inputs, "fp32", backend="cuda")
    with pytest.raises(ValueError, match="no speculative schedule"):
        speculative_decode_reference(*inputs, "nvfp4/fp16sr@4")

"""The Mamba-2 step reference against an independent naive recurrence, eager decoding, and bad input.

The naive decoder below keeps, per sequence, the unrounded state accumulated since the newest
checkpoint (R = sum dt_i G x_i B_i^T, a recurrence) and the window phase j = n mod L itself; it
shares nothing with the reference but `write_checkpoint` (the formats are the quant library's).
The helpers here (`make_inputs`, `assert_close`, `cat_states`) are used by the other Mamba-2 tests.
"""

import pytest
import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.mamba2 import chunked, decode_reference, speculative_decode_reference
from replayssm_eval.replay.schedule import ScheduleState
from replayssm_eval.replay.state import ReplayState, write_checkpoint
from replayssm_eval.quant import PackedState

CONFIGS = ["fp32", "shared:nvfp4", "nvfp4/fp16sr", "nvfp4/fp8sr", "fp16/fp32"]
WINDOWS = [1, 4, 16]


def test_assert_close_bounds_each_flip():
    """A flip budget of 1% admits 65 of 6,660 elements one grid step off, never 65 elements at 1e6."""
    ref = torch.randn(6660, generator=torch.Generator().manual_seed(0))
    stepped = ref.clone()
    stepped[:65] += 0.1 * ref.abs().max()
    assert_close("stepped", ref, stepped, 1e-5, flips=0.01)
    wild = ref.clone()
    wild[:65] = 1e6
    with pytest.raises(AssertionError, match="more than a flipped rounding"):
        assert_close("wild", ref, wild, 1e-5, flips=0.01)
    with pytest.raises(AssertionError, match=r"allowed 0.50%"):
        assert_close("too many", ref, stepped, 1e-5, flips=0.005)


def make_inputs(batch=3, tokens=37, heads=3, head_dim=20, groups=3, d_state=24, dtype=torch.float64, seed=0,
                slow_heads=True):
    """Random Mamba-2 inputs; with slow_heads some heads decay slowly (the ones where errors accumulate)."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    x = rand(batch, tokens, heads, head_dim)
    dt = torch.nn.functional.softplus(rand(batch, tokens, heads) - 1.0)  # [B, T, H]
    A = -torch.exp(rand(heads))  # [H]
    if slow_heads:
        A[0] = -0.02
    B, C = rand(batch, tokens, groups, d_state), rand(batch, tokens, groups, d_state)
    D = rand(heads)
    state = 3.0 * torch.randn(batch, heads, head_dim, d_state, generator=gen)  # FP32 at the anchor
    return x, dt, A, B, C, D, state


FLIP_SIZE = 0.5  # the most a flipped element may differ, relative to max|ref| (an NVFP4 step is <= 1/3 of its block max)


def assert_close(name, ref, got, rtol, atol=0.0, flips=0.0):
    """|got - ref| <= atol + rtol * max|ref| elementwise, reporting the max abs error and the RMS error ratio.

    flips: the fraction of elements allowed beyond the bound. Only for FP32 runs of quantized
    formats: two FP32 paths that sum in different orders put a state within an ulp of a rounding
    boundary on different sides now and then (for fp16sr one FP32 ulp moves the SR fraction by
    2^-13, so about 1 element in 8192 per ulp of difference), and each such flip is one grid step
    of one element, so a flipped element must still be within FLIP_SIZE * max|ref|. FP64 runs
    must make identical decisions and use flips=0.
    """
    ref, got = ref.double(), got.double()
    assert ref.shape == got.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    if not ref.numel():
        return
    err = (got - ref).abs()
    max_err = err.max().item()
    rms_ratio = (err.square().mean().sqrt() / ref.square().mean().sqrt().clamp_min(1e-300)).item()
    bound = atol + rtol * ref.abs().max().item()
    beyond = (err > bound).double().mean().item()
    flip_bound = max(bound, FLIP_SIZE * ref.abs().max().item())
    assert max_err <= flip_bound, f"{name}: max abs error {max_err:.3e} > {flip_bound:.3e}, more than a flipped rounding"
    assert beyond <= flips and not torch.isnan(got).any(), (
        f"{name}: max abs error {max_err:.3e} > {bound:.3e} at {beyond:.2%} of elements (allowed {flips:.2%}); "
        f"RMS error ratio {rms_ratio:.3e}")


def sliced(inputs, start, stop):
    """Tokens [start, stop) of make_inputs' per-token tensors (A, D and the state unchanged)."""
    x, dt, A, B, C, D, state = inputs
    return x[:, start:stop], dt[:, start:stop], A, B[:, start:stop], C[:, start:stop], D, state


def cat_states(states: list[ReplayState]) -> ReplayState:
    """Stack single-sequence ReplayStates into one batch (their phases may differ)."""
    cat = lambda get: torch.cat([get(s) for s in states])  # noqa: E731
    first = states[0]
    sched = ScheduleState(*(cat(lambda s, f=f: getattr(s.schedule, f)) for f in ("count", "step_left", "step_read_hi", "steps")))
    packed = None
    if all(s.lo_packed is not None for s in states):
        fields = [None if getattr(first.lo_packed, f) is None else cat(lambda s, f=f: getattr(s.lo_packed, f))
                  for f in ("data", "scales", "global_scale")]
        packed = PackedState(first.lo_packed.format, (len(states), *first.lo_packed.shape[1:]), *fields)
    return ReplayState(cat(lambda s: s.hi), cat(lambda s: s.lo), {k: cat(lambda s, k=k: s.buffer[k]) for k in first.buffer},
                       sched, cat(lambda s: s.checkpoint), cat(lambda s: s.seq_ids), first.layer, packed)


def phased_state(fn, inputs, config, pre, compute_dtype=torch.float64):
    """Decode pre[b] tokens of sequence b alone with `fn` and stack the results: sequences at different phases."""
    x, dt, A, B, C, D, state = inputs
    parts = []
    for b, n in enumerate(pre):
        one = lambda t: t[b:b + 1, :n]  # noqa: E731
        _, st = fn(one(x), one(dt), A, one(B), one(C), D, state[b:b + 1], config, seq_ids=[b],
                   compute_dtype=compute_dtype)
        parts.append(st)
    return cat_states(parts)


def naive_decode(inputs, config: ReplayConfig, seq: int, layer=0):
    """One sequence from its anchor, token by token, in FP64 with the recurrence form; returns y [T, H, P] and (S_hi, S_lo)."""
    x, dt, A, B, C, D, state = (t.double() for t in inputs)
    x, dt, B, C = x[seq], dt[seq], B[seq], C[seq]
    heads, groups = x.shape[1], B.shape[1]
    ids = torch.tensor([seq])
    hi, lo = write_checkpoint(state[seq:seq + 1].float(), config, layer, ids, torch.tensor([0]))
    R = torch.zeros_like(state[seq])  # [H, P, N]
    g = torch.ones(heads, dtype=torch.float64)
    checkpoint, ys = 0, []
    for t in range(x.shape[0]):
        Bh = B[t].repeat_interleave(heads // groups, 0)  # [H, N]
        Ch = C[t].repeat_interleave(heads // groups, 0)
        a = torch.exp(dt[t] * A)  # [H]
        R = a[:, None, None] * R + dt[t][:, None, None] * x[t][:, :, None] * Bh[:, None, :]
        g = a * g
        gk = g if config.skip_read_below is None else torch.where(g < config.skip_read_below, 0.0, g)
        flush = t % config.window == config.window - 1
        src = (hi if flush else lo)[0].double()
        S = gk[:, None, None] * src + R
        ys.append((S * Ch[:, None, :]).sum(-1) + D[:, None] * x[t])
        if flush:
            checkpoint += 1
            hi, lo = write_checkpoint(S[None], config, layer, ids, torch.tensor([checkpoint]))
            R, g = torch.zeros_like(R), torch.ones_like(g)
    return torch.stack(ys), (hi[0], lo[0])


def _config(text, window):
    return ReplayConfig.parse(f"{text}@{window}")


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("text", CONFIGS)
def test_reference_matches_naive(text, window):
    """Awkward T = 37 in two calls, sequences at different phases, FP64: same outputs and identical checkpoints."""
    config = _config(text, window)
    inputs = make_inputs()
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
        y_naive, (hi, lo) = naive_decode(sliced(inputs, 0, pre[b] + 26), config, b)
        assert_close(f"y[{b}]", y_naive[pre[b]:], y[b], 1e-12)
        assert torch.equal(final.hi[b], hi) and torch.equal(final.lo[b], lo), f"checkpoints of sequence {b} differ"


@pytest.mark.parametrize("text", ["shared:nvfp4@1", "nvfp4/fp16sr@4", "fp16/fp32@16"])
def test_reference_fp32_compute_matches_naive(text):
    config = ReplayConfig.parse(text)
    inputs = make_inputs(batch=2, tokens=21, heads=2, head_dim=5, groups=1, d_state=16, dtype=torch.float32)
    y, _ = decode_reference(*inputs, config)
    for b in range(2):
        y_naive, _ = naive_decode(inputs, config, b)
        assert_close(f"y[{b}]", y_naive, y[b], 2e-5)


@pytest.mark.parametrize("text", ["shared:nvfp4@4#skip=0.3", "nvfp4/fp8sr@8#skip=0.5"])
def test_skip_read_below(text):
    """Skipping the checkpoint term of heads whose decay since the checkpoint is small: naive == reference, and it changes y."""
    config = ReplayConfig.parse(text)
    inputs = make_inputs(batch=2, tokens=19)
    y, _ = decode_reference(*inputs, config, compute_dtype=torch.float64)
    y_full, _ = decode_reference(*inputs, config.replace(skip_read_below=None), compute_dtype=torch.float64)
    assert (y - y_full).abs().max() > 1e-3, "no head was skipped: the test would not see a wrong skip rule"
    for b in range(2):
        y_naive, _ = naive_decode(inputs, config, b)
        assert_close(f"y[{b}]", y_naive, y[b], 1e-12)


@pytest.mark.parametrize("fmt", ["fp16", "fp16sr", "fp8sr", "nvfp4", "bf16"])
def test_window_one_is_eager_decoding(fmt):
    """L = 1, shared: y from the unrounded updated state, the stored state rounded every step."""
    config = ReplayConfig.parse(f"{fmt}@1#seed=7")
    inputs = make_inputs(batch=2, tokens=13, groups=1)
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
    inputs = make_inputs(batch=2, tokens=9)
    run = lambda text: decode_reference(*inputs, text, compute_dtype=torch.float64)[1].hi  # noqa: E731
    assert torch.equal(run("nvfp4/fp16sr@4#seed=3"), run("nvfp4/fp16sr@4#seed=3"))
    assert not torch.equal(run("nvfp4/fp16sr@4#seed=3"), run("nvfp4/fp16sr@4#seed=4"))


def test_returned_state():
    inputs = make_inputs(batch=2, tokens=10)
    y, st = decode_reference(*inputs, "nvfp4/fp8sr@4", compute_dtype=torch.float64)
    assert y.dtype == torch.float64 and y.shape == inputs[0].shape
    assert st.checkpoint.tolist() == [2, 2] and st.schedule.count.tolist() == [2, 2]
    assert st.buffer["x"].shape == (2, 4, 3, 20) and st.buffer["B"].shape == (2, 4, 3, 24) and st.buffer["dt"].shape == (2, 4, 3)
    assert torch.equal(st.buffer["x"][:, :2], inputs[0][:, 8:])
    assert torch.equal(ReplayConfig.parse("nvfp4/fp8sr").read_format.decode(st.lo_packed), st.lo)
    assert st.lo_packed.data.dtype == torch.uint8


def _bad_input_cases():
    x, dt, A, B, C, D, s0 = make_inputs(batch=2, tokens=5, dtype=torch.float32)
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
    inputs = make_inputs(batch=2, tokens=5, dtype=torch.float32)
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

"""Tensors and replay states against a reference: the error bound, the max abs error and the RMS error ratio."""

import torch

FLIP_SIZE = 0.5  # the most a flipped element may differ, relative to max|ref| (an NVFP4 step is <= 1/3 of its block max)
RESIDUAL_FLIP = 2.0  # the same for an error-feedback residual: a flip moves it a grid step, twice the largest
SCHEDULE_FIELDS = ("count", "step_left", "step_read_hi", "steps")


def assert_close(name, ref, got, rtol, atol=0.0, flips=0.0):
    """|got - ref| <= atol + rtol * max|ref| elementwise, same shape, no NaN; reports the max abs error and the RMS
    error ratio.

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


def mostly_equal(name, ref, got, fraction=0.98, noise=None, flip_size=FLIP_SIZE):
    """All but a few elements equal to FP32 noise (a global scale's amax one ulp apart moves a whole row by an ulp);
    the rest are rounding decisions that flipped, each within flip_size * max|ref| (one grid step, not garbage).
    noise: the per-element FP32 noise bound, 1e-5 max|ref| by default."""
    err = (got - ref).abs()
    close = (err <= (1e-5 * ref.abs().max() if noise is None else noise)).float().mean().item()
    assert close >= fraction, f"{name}: only {close:.1%} of elements agree"
    worst, bound = err.max().item(), flip_size * ref.abs().max().item()
    assert worst <= bound, f"{name}: an element is {worst:.3e} off (> {bound:.3e}), more than a flipped rounding"


def assert_same_state(ref, got, rtol=0.0, flips=0.0, buffer_rtol=0.0, whole_buffer=False):
    """ReplayStates: the same checkpoint indices and schedule; stored copies and error-feedback residuals bit for bit
    (rtol 0, the packed read copy too) or within rtol with `flips` as in assert_close; the valid buffer entries
    ([b, :count[b]]; with whole_buffer every slot) bit for bit (buffer_rtol 0) or within buffer_rtol (entries a path
    computes in its own order)."""
    for name in ("hi", "lo"):
        assert_close(f"S_{name}", getattr(ref, name), getattr(got, name), rtol, flips=flips)
    assert torch.equal(ref.checkpoint, got.checkpoint), f"checkpoints differ: {got.checkpoint.tolist()}"
    assert set(ref.residual) == set(got.residual), f"residuals of copies {sorted(got.residual)} != {sorted(ref.residual)}"
    for copy in ref.residual:
        assert_close(f"residual[{copy}]", ref.residual[copy], got.residual[copy], rtol, flips=flips)
    for field in SCHEDULE_FIELDS:
        assert torch.equal(getattr(ref.schedule, field), getattr(got.schedule, field)), field
    assert set(ref.buffer) == set(got.buffer), f"buffer entries {sorted(got.buffer)} != {sorted(ref.buffer)}"
    for key in ref.buffer:
        if whole_buffer:
            assert_close(f"buffer[{key!r}]", ref.buffer[key], got.buffer[key], buffer_rtol)
            continue
        for b, count in enumerate(ref.schedule.count.tolist()):
            assert_close(f"buffer[{key!r}] of sequence {b}", ref.buffer[key][b, :count], got.buffer[key][b, :count],
                         buffer_rtol)
    if rtol == 0 and ref.lo_packed is not None:
        for field in type(ref.lo_packed).FIELDS:
            a, b = getattr(ref.lo_packed, field), getattr(got.lo_packed, field)
            assert (a is None and b is None) or torch.equal(a, b), f"lo_packed.{field} differs"


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|."""
    return ((got - want).abs().max() / want.abs().max()).item()


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bitwise equality of FP32 tensors (NaN positions must match; NaN payloads are free)."""
    a, b = a.float(), b.float()
    assert a.shape == b.shape
    nan = torch.isnan(a)
    assert torch.equal(nan, torch.isnan(b)), f"NaN positions differ at {int((nan != torch.isnan(b)).sum())} places"
    ai, bi = a.view(torch.int32)[~nan], b.view(torch.int32)[~nan]
    bad = ai != bi
    assert not bad.any(), (
        f"{int(bad.sum())} of {ai.numel()} differ, e.g. {a[~nan][bad][:4].tolist()} vs {b[~nan][bad][:4].tolist()}")

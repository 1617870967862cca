"""GDN Triton kernels against the torch reference (TRITON_INTERPRET=1 on CPU; tests/conftest.py sets it), on the
device under test (`REPLAYSSM_TEST_DEVICE=cuda` runs the compiled kernels).

FP32 compute in two different orders can put a value on either side of a rounding midpoint, so
with quantized formats the stored states are compared for (nearly all) identical elements and
the outputs loosely; the in-kernel rounding itself is checked bit for bit on its own. (The Philox
key must reach `tl.randint` as a loaded int64, as the kernels do: a Python-int kernel argument
gave different bits in the interpreter.)
"""

import dataclasses
import sys
import warnings
from unittest import mock

import pytest
import torch
import triton
import triton.language as tl
from test_gdn_reference import assert_close, cut, make_inputs, phased_start
from test_mamba2_reference import FLIP_SIZE

from replayssm_eval.kernels.config import ReplayConfig
from replayssm_eval.kernels.gdn import chunked, decode_reference
from replayssm_eval.kernels.gdn._common import _prepare, buffer_capacity, buffer_keys, to_format_layout
from replayssm_eval.kernels.gdn import triton as gdn_triton
from replayssm_eval.kernels.gdn.reference import _verify
from replayssm_eval.kernels.schedule import ScheduleState
from replayssm_eval.kernels.state import ReplayState, write_checkpoint, write_checkpoint_packed

SMALL = dict(batch=2, heads=2, value_heads=4, dk=20, dv=24)
QWEN_HEAD = dict(batch=1, heads=1, value_heads=2, dk=128, dv=128)  # Qwen3.5-4B's head size (K = V = 128), two heads
AWKWARD = dict(heads=2, value_heads=4, dk=24, dv=40)  # grouped heads (HV = 2H), K and V not powers of two


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
def test_in_kernel_rounding_is_bit_exact(spec, device):
    """`_store_round` inside a kernel == write_checkpoint (fmt.quantize with the Philox bits of `kernels.keys`)."""
    cfg = ReplayConfig(read=spec, recur=spec, window=4, seed=7)
    x = torch.randn(1, 3, 24, 40) * torch.logspace(-3, 2, 40)  # [B, HV, V, K], rows of mixed magnitude
    x[0, 1, 3] = 0.0
    kind, scale, top = gdn_triton._store_mode(cfg.recur_format, whole_head=True)
    y = torch.empty_like(x, device=device)
    key = gdn_triton.sr_keys(7, 2, torch.tensor([5], device=device), 0)  # [1] int64, loaded in-kernel as the kernels do
    _round_tile_kernel[(3,)](x.to(device), y, key, torch.tensor([9], device=device), 3, 40, 24, KIND=kind, SCALE=scale,
                             FMT_MAX=top, BK=64, BV=32)
    want, _ = write_checkpoint(x, cfg, 2, torch.tensor([5]), torch.tensor([9]))  # the torch rounding, on CPU
    y = y.cpu()
    assert torch.equal(y, want), f"{spec}: {(y != want).sum().item()} of {y.numel()} elements differ"


def _mostly_equal(name, ref, got, fraction=0.98, noise=None):
    """All but a few elements equal to FP32 noise (a global scale's amax one ulp apart moves a whole row by an ulp);
    the rest are rounding decisions that flipped, each within FLIP_SIZE * max|ref| (one grid step, not garbage).
    noise: the per-element FP32 noise bound, 1e-5 max|ref| by default."""
    err = (got - ref).abs()
    close = (err <= (1e-5 * ref.abs().max() if noise is None else noise)).float().mean().item()
    assert close >= fraction, f"{name}: only {close:.1%} of elements agree"
    worst, bound = err.max().item(), FLIP_SIZE * ref.abs().max().item()
    assert worst <= bound, f"{name}: an element is {worst:.3e} off (> {bound:.3e}), more than a flipped rounding"


def test_mostly_equal_bounds_each_flip():
    """A 1% flip budget admits 65 of 6,660 elements one grid step off, never 65 elements at 1e6."""
    ref = torch.randn(6660, generator=torch.Generator().manual_seed(0))
    stepped, wild = ref.clone(), ref.clone()
    stepped[:65] += 0.1 * ref.abs().max()
    wild[:65] = 1e6
    _mostly_equal("stepped", ref, stepped, 0.99)
    with pytest.raises(AssertionError, match="more than a flipped rounding"):
        _mostly_equal("wild", ref, wild, 0.99)


def _rounds_to(fold, rounded, cfg) -> bool:
    """The stored copies of `rounded` are exactly write_checkpoint of the FP32 folds in `fold` (by the torch rounding on
    CPU: on CUDA write_checkpoint would run the Triton encoder)."""
    hi, lo = write_checkpoint(fold.hi.cpu(), cfg, 0, rounded.seq_ids.cpu(), rounded.checkpoint.cpu())
    return torch.equal(hi, rounded.hi.cpu()) and torch.equal(lo, rounded.lo.cpu())


@pytest.mark.parametrize("text", ["fp32/fp32@4", "fp32/fp32@4#closed#skip=0.7", "fp32/fp32@5#spec=3:0.6#closed"])
def test_chunked_triton_fp32(text, device):
    inputs = make_inputs(seqlen=21, dtype=torch.float32, device=device, **SMALL)
    start = phased_start(inputs, text, warmup=(0, 3), dtype=torch.float32)
    o_ref, st_ref = decode_reference(*cut(inputs, 0), start, text)
    o, st = chunked(*cut(inputs, 0), start, text, backend="triton")
    assert_close("o", o_ref, o, 1e-5)
    assert_close("S_hi", st_ref.hi, st.hi, 1e-5)
    for name in st_ref.buffer:
        assert_close(f"buffer[{name!r}]", st_ref.buffer[name], st.buffer[name], 1e-5)
    assert torch.equal(st_ref.checkpoint, st.checkpoint)


@pytest.mark.parametrize("text", ["nvfp4:scale=row/fp16sr@4#closed", "shared:nvfp4:scale=head@8", "fp8sr/fp16@4"])
def test_chunked_triton_quantized(text, device):
    inputs = make_inputs(seqlen=13, dtype=torch.float32, device=device, **SMALL)
    o_ref, st_ref = chunked(*inputs, text)
    o, st = chunked(*inputs, text, backend="triton")
    assert_close("o", o_ref, o, 2e-3)
    _mostly_equal("S_hi", st_ref.hi, st.hi)
    _mostly_equal("S_lo", st_ref.lo, st.lo)


def test_chunked_triton_refuses_fp64(device):
    inputs = make_inputs(seqlen=5, dtype=torch.float32, device=device, **SMALL)
    with pytest.raises(ValueError, match="backend='triton' computes in FP32"):
        chunked(*inputs, "fp32", backend="triton", compute_dtype=torch.float64)


@pytest.mark.parametrize("text, exact", [("fp32/fp32@3#closed", True), ("nvfp4/fp16sr@4", False), ("shared:fp8sr@3#skip=0.8", False)])
def test_decode_step_triton(text, exact, device):
    """Token by token through the step kernel (packed read copy on non-flush steps) == decode_reference."""
    inputs = make_inputs(seqlen=6, dtype=torch.float32, device=device, **SMALL)
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


def test_verify_triton(device):
    """Speculative verification kernel == the reference's output-only verification, per sequence."""
    cfg = ReplayConfig.parse("nvfp4/fp32@8#spec=4:0.5")
    inputs = make_inputs(seqlen=7, dtype=torch.float32, device=device, **SMALL)
    st = inputs[5]
    for n in range(3):  # committed entries and a packed read copy, from the step kernel
        _, st = gdn_triton.decode_step_triton(*cut(inputs, n, n + 1), st, cfg)
    drafts = dict(zip(("q", "k", "v", "g", "beta"), cut(inputs, 3, 7)))
    width = torch.tensor([4, 3], device=device)
    read_hi = torch.tensor([False, True], device=device)
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


@triton.jit
def _round_vblock_kernel(x_ptr, y_ptr, key_ptr, checkpoint_ptr, HV, K, V, KIND: tl.constexpr, SCALE: tl.constexpr,
                         FMT_MAX: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    hv = tl.program_id(0)
    ks = tl.arange(0, BK)
    vs = tl.program_id(1) * BV + tl.arange(0, BV)  # one block of BV value columns, as the chunked kernel's grid
    mask = (ks[:, None] < K) & (vs[None, :] < V)
    elem = (hv * V + vs[None, :]).to(tl.int64) * K + ks[:, None]
    x = tl.load(x_ptr + elem, mask=mask, other=0.0)
    y = gdn_triton._store_round(x, tl.load(key_ptr), tl.load(checkpoint_ptr), elem, KIND, SCALE, FMT_MAX, BK, BV)
    tl.store(y_ptr + elem, y, mask=mask)


@pytest.mark.parametrize("spec, bv", [("nvfp4:scale=row", 64), ("nvfp4:scale=head", 128), ("fp16sr", 64), ("fp8sr", 64),
                                      ("fp8:scale=head", 128)])
def test_in_kernel_rounding_bit_exact_k128(spec, bv, device):
    """`_store_round` at K = V = 128 with the chunked kernel's tiles (BK = 128 in 8 NVFP4 blocks; 64-wide v-blocks for
    row scales, the whole head for head scales) == write_checkpoint, bit for bit."""
    cfg = ReplayConfig(read=spec, recur=spec, window=4, seed=3)
    x = torch.randn(1, 2, 128, 128) * torch.logspace(-2, 1, 128)  # [B, HV, V, K]
    x[0, 1, 70] = 0.0  # a zero row in the second v-block
    kind, scale, top = gdn_triton._store_mode(cfg.recur_format, whole_head=True)
    y = torch.empty_like(x, device=device)
    key = gdn_triton.sr_keys(3, 1, torch.tensor([2], device=device), 0)
    _round_vblock_kernel[(2, 128 // bv)](x.to(device), y, key, torch.tensor([5], device=device), 2, 128, 128, KIND=kind,
                                         SCALE=scale, FMT_MAX=top, BK=128, BV=bv)
    want, _ = write_checkpoint(x, cfg, 1, torch.tensor([2]), torch.tensor([5]))  # the torch rounding, on CPU
    y = y.cpu()
    assert torch.equal(y, want), f"{spec}: {(y != want).sum().item()} of {y.numel()} elements differ"


@pytest.mark.parametrize("text", ["nvfp4:scale=row/fp16sr@16", "nvfp4:scale=head/fp8sr@16#closed"])
def test_chunked_triton_lockstep_k128(text, device):
    """Quantized chunked at K = V = 128, one checkpoint at a time from identical stored copies (what
    benchmarks/gpu_check_gdn.py judges on the GPU): outputs and pre-round folds agree to FP32 accuracy, the kernel's
    stored copies are exactly `write_checkpoint` of its own pre-round fold, and only a few rounding decisions differ
    from the torch path's (the free-running runs then diverge by the format's noise: not a kernel error)."""
    cfg = ReplayConfig.parse(text)
    c32 = dataclasses.replace(cfg, read="fp32", recur="fp32")  # same window and fold: write_checkpoint is the identity
    inputs = make_inputs(seqlen=32, dtype=torch.float32, decay=0.3, device=device, **QWEN_HEAD)
    prep = lambda x, st: _prepare(*x, st, cfg, layer_idx=0, seq_ids=None, compute_dtype=torch.float32)  # noqa: E731
    state = prep(cut(inputs, 0, 1), inputs[5]).state  # checkpoint 0 as a ReplayState
    for w in (0, 16):
        x = cut(inputs, w, w + 16)
        o_t, st_t = chunked(*x, state, cfg)
        o_k, st_k = chunked(*x, state, cfg, backend="triton")
        assert_close(f"o[{w}:]", o_t, o_k, 1e-5)
        _, f_t = chunked(*x, state, c32)
        _, f_k = gdn_triton.chunked_triton(prep(x, state), rounded=False)
        assert_close(f"pre-round fold {w}", f_t.hi, f_k.hi, 1e-5)
        assert _rounds_to(f_k, st_k, cfg), "in-kernel rounding != write_checkpoint of the kernel's fold"
        for name, ref, got in (("S_hi", st_t.hi, st_k.hi), ("S_lo", st_t.lo, st_k.lo)):
            _mostly_equal(f"{name} after window {w}", ref, got, 0.99, noise=1e-6 * (ref.abs() + ref.abs().max()))
        state = st_t


@pytest.mark.parametrize("text", ["fp32/fp32@4#closed", "fp32/fp32@3#skip=0.6", "nvfp4:scale=row/fp16sr@4#closed#skip=0.6",
                                  "fp8sr/fp16@3", "shared:fp16sr@4#spec=3:0.6#closed"])
def test_chunked_triton_blocks(text, device, monkeypatch):
    """Awkward sizes (grouped heads, K = 24, V = 40 in two v-blocks, one segment per launch block), from carried
    buffers at differing phases: == decode_reference (FP32 formats) and the torch backend (outputs to FP32 accuracy,
    stored copies all but a few flipped roundings, the same checkpoints), and the stored copies are exactly
    `write_checkpoint` of the kernel's own pre-round fold."""
    cfg = ReplayConfig.parse(text)
    inputs = make_inputs(batch=2, seqlen=10, dtype=torch.float32, device=device, **dict(AWKWARD, heads=1, value_heads=2))
    start = phased_start(inputs, cfg, warmup=(0, 3), dtype=torch.float32)
    x = cut(inputs, 3)
    o_t, st_t = chunked(*x, start, cfg)
    monkeypatch.setattr(gdn_triton, "chunked_launch_config",
                        lambda *args: {"BV": 32, "num_warps": 4, "DOT": "ieee"})
    with _one_segment_launches():
        o_k, st_k = chunked(*x, start, cfg, backend="triton")
    assert torch.equal(st_t.checkpoint, st_k.checkpoint) and int((st_k.checkpoint - start.checkpoint).min()) >= 1
    if cfg.recur == "fp32":
        o_ref, st_ref = decode_reference(*x, start, cfg)
        assert_close("o", o_ref, o_k, 1e-5)
        assert_close("S_hi", st_ref.hi, st_k.hi, 1e-5)
        for name in st_ref.buffer:
            assert_close(f"buffer[{name!r}]", st_ref.buffer[name], st_k.buffer[name], 1e-5)
    assert_close("o vs torch", o_t, o_k, 1e-5 if cfg.recur == "fp32" else 2e-3)
    _mostly_equal("S_hi vs torch", st_t.hi, st_k.hi)
    _mostly_equal("S_lo vs torch", st_t.lo, st_k.lo)
    _assert_first_fold_rounds_exactly(inputs, cfg)


def _one_segment_launches():
    """Every `_chunked_kernel` launch runs one segment (SEGS=1), the launch of copies that torch rounds. On a GPU a
    different SEGS is a different compiled kernel, whose FP32 folds (tf32x3 dots) may differ in the last bit. (The
    package exports a function named `chunked`: the module itself is patched.)"""
    return mock.patch.object(sys.modules["replayssm_eval.kernels.gdn.chunked"], "_BLOCK_ELEMENTS", 1)


def _assert_first_fold_rounds_exactly(inputs, cfg):
    """Through the first fold from a common state, the stored copies are bit for bit `write_checkpoint` of the
    kernel's own pre-round fold (rounded in the kernel or by torch; both runs launch the same kernel variant)."""
    prep = lambda n, st: _prepare(*cut(inputs, 0, n), st, cfg, layer_idx=0, seq_ids=None, compute_dtype=torch.float32)  # noqa: E731
    state = prep(1, inputs[5]).state
    n = int(prep(None, state).plan.fold_after[0].nonzero()[0]) + 1
    with _one_segment_launches():
        _, rounded = gdn_triton.chunked_triton(prep(n, state))
        _, fold = gdn_triton.chunked_triton(prep(n, state), rounded=False)
    assert _rounds_to(fold, rounded, cfg), "stored copies != write_checkpoint of the kernel's fold"


def _triton_no_fallback(*args):
    """chunked(backend="triton"), failing on any UserWarning (such as a fallback's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        return chunked(*args, backend="triton")


# copies no program can round (tensor-wide scales, blocks along V); the sequences start 3 tokens apart, so @3 folds
# both in the same segments and the other windows fold one without the other
@pytest.mark.parametrize("text", ["shared:nvfp4@4", "nvfp4/fp16sr@4", "nvfp4/fp32@4#closed",
                                  "shared:fp8:scale=tensor@4", "fp8sr:scale=tensor/fp32@5#skip=0.6",
                                  "nvfp4:axis=headdim/fp16sr@4", "fp16/nvfp4@3#closed",
                                  "nvfp4/nvfp4:axis=headdim@4#spec=3:0.6"])
def test_chunked_triton_torch_rounded_copies(text, device):
    """Copies in formats no program can round run on Triton, one segment per launch with that copy rounded by torch.
    Awkward sizes, sequences at different phases, three calls in a row, each from its own backend's state: == the
    torch backend (outputs to the quantized tolerance, stored copies all but a few flipped roundings, the same
    checkpoints and buffers), == decode_reference where the recurrence is FP32, and the stored copies are exactly
    `write_checkpoint` of the kernel's own fold."""
    cfg = ReplayConfig.parse(text)
    assert None in (gdn_triton._store_mode(cfg.recur_format, True), gdn_triton._store_mode(cfg.read_format, True))
    inputs = make_inputs(batch=2, seqlen=17, dtype=torch.float32, device=device, **AWKWARD)
    ref = tri = start = phased_start(inputs, cfg, warmup=(0, 3), dtype=torch.float32)
    for first, stop in ((3, 9), (9, 10), (10, 17)):
        x = cut(inputs, first, stop)
        o_t, ref = chunked(*x, ref, cfg)
        o_k, tri = _triton_no_fallback(*x, tri, cfg)
        assert_close(f"o[{first}:{stop}] vs torch", o_t, o_k, 2e-3)
        _mostly_equal("S_hi vs torch", ref.hi, tri.hi)
        _mostly_equal("S_lo vs torch", ref.lo, tri.lo)
        assert torch.equal(ref.checkpoint, tri.checkpoint)
        for name in ref.buffer:
            assert_close(f"buffer[{name!r}]", ref.buffer[name], tri.buffer[name], 2e-3)
        if cfg.shared:
            assert tri.lo is tri.hi
    assert int((tri.checkpoint - start.checkpoint).min()) >= 2
    if cfg.recur == "fp32":
        o_ref, st_ref = decode_reference(*cut(inputs, 3), start, cfg)
        o_k, st_k = _triton_no_fallback(*cut(inputs, 3), start, cfg)
        assert_close("o vs decode_reference", o_ref, o_k, 1e-5)
        assert_close("S_hi vs decode_reference", st_ref.hi, st_k.hi, 1e-5)
    _assert_first_fold_rounds_exactly(inputs, cfg)


@pytest.mark.parametrize("text, by_torch", [
    ("nvfp4:scale=row/fp16sr@4", "read"),
    ("fp8sr/fp16sr@4#closed#skip=0.6", "recur"),
    ("shared:fp16sr@4#spec=3:0.6#closed", "recur"),
    ("fp8sr/nvfp4:scale=row@4", "read/recur"),
])
def test_torch_rounding_equals_in_kernel(text, by_torch, device, monkeypatch):
    """The torch rounding between one-segment launches, forced on formats the kernel rounds: outputs, stored copies,
    checkpoints and buffers bit for bit those of the in-kernel rounding with one-segment launches too (same folds;
    the torch rounding uses the kernel's keys, Philox counters and checkpoint indices, SR included)."""
    cfg = ReplayConfig.parse(text)
    inputs = make_inputs(batch=2, seqlen=12, dtype=torch.float32, device=device, **AWKWARD)
    start = phased_start(inputs, cfg, warmup=(0, 3), dtype=torch.float32)
    x = cut(inputs, 3)
    with _one_segment_launches():
        o_in, st_in = chunked(*x, start, cfg, backend="triton")
    forced = [getattr(cfg, f"{copy}_format") for copy in by_torch.split("/")]
    store_mode = gdn_triton._store_mode
    monkeypatch.setattr(gdn_triton, "_store_mode",
                        lambda fmt, whole_head: None if fmt in forced else store_mode(fmt, whole_head))
    assert gdn_triton._store_mode(cfg.recur_format if by_torch == "recur" else cfg.read_format, True) is None
    o_out, st_out = _triton_no_fallback(*x, start, cfg)
    assert torch.equal(o_out, o_in)
    assert torch.equal(st_out.hi, st_in.hi) and torch.equal(st_out.lo, st_in.lo)
    assert torch.equal(st_out.checkpoint, st_in.checkpoint) and int((st_in.checkpoint - start.checkpoint).min()) >= 2
    assert all(torch.equal(st_out.buffer[name], st_in.buffer[name]) for name in st_in.buffer)


# ---------------------------------------------------------------------------------------------- single-token step kernel


def _phased_state(cfg, s0, heads, counts, read_hi, seed=1):
    """A ReplayState at checkpoint 0 (written from s0 [B, HV, K, V], read copy packed) with counts[b] random committed
    entries of `heads` key heads and step_read_hi = read_hi (speculative schedules): sequences at different phases."""
    bsz, nv, dk, dv = s0.shape
    device = s0.device
    gen = torch.Generator().manual_seed(seed)
    zeros = torch.zeros(bsz, dtype=torch.int64, device=device)
    seq_ids = torch.arange(bsz, device=device)
    hi, lo, packed = write_checkpoint_packed(to_format_layout(s0).contiguous(), cfg, 0, seq_ids, zeros)
    cap = buffer_capacity(cfg)
    rand = lambda *shape: torch.randn(bsz, cap, *shape, generator=gen).to(device)  # noqa: E731  the same draws everywhere
    entries = {"k": torch.nn.functional.normalize(rand(heads, dk), dim=-1), "u": 0.3 * rand(nv, dv),
               "g": -0.4 * rand(nv).abs(), "v": rand(nv, dv), "beta": torch.sigmoid(rand(nv))}
    count = torch.tensor(counts, device=device)
    valid = (torch.arange(cap, device=device)[None, :] < count[:, None])  # [B, cap]
    buffer = {name: entries[name] * valid.view(bsz, cap, *[1] * (entries[name].dim() - 2)) for name in buffer_keys(cfg)}
    schedule = ScheduleState(count, zeros, torch.tensor(read_hi, device=device), zeros.clone())
    return ReplayState(hi, lo, buffer, schedule, zeros.clone(), seq_ids, 0, packed)


def _no_general_step(*args, **kwargs):
    raise AssertionError("decode_step_triton launched the general (verify) step kernel")


_STEP_LAUNCHES = [{"BLOCK_V": 16, "BLOCK_K": 16, "TILES": 3, "num_warps": 4},  # one program per head, K in 2 chunks
                  {"BLOCK_V": 16, "BLOCK_K": 32, "TILES": 2, "num_warps": 1}]  # 2nd program: a part tile, a padding tile


@pytest.mark.parametrize("text, launch", [
    ("fp32/fp32@4", None),
    ("fp16/fp32@4", 0),
    ("bf16/fp32@4", 1),
    ("fp8:scale=row/fp32@4#closed", 0),
    ("fp8:scale=head/fp32@4#skip=0.5", 1),
    ("fp8:scale=tensor/fp32@4", None),
    ("fp8:scale=none/fp32@4", 0),
    ("fp8e5m2/fp32@4", 1),
    ("nvfp4:scale=row/fp32@4", 0),
    ("nvfp4:scale=head/fp32@4#closed#skip=0.5", 1),
    ("nvfp4/fp32@4", None),
    ("nvfp4:axis=headdim/fp32@4", 1),
    ("shared:fp8sr@4#closed", 0),
    ("nvfp4:scale=row/fp32@4#spec=3:0.6", 1),
    ("fp8/fp32@4#spec=3:0.6#closed#skip=0.5", 0),
])
def test_replay_step_kernel_matches_reference(text, launch, device, monkeypatch):
    """decode_step_triton (`_replay_step_kernel` only) == decode_reference, step by step from the same state: sequences
    at different phases, so launches without folds and launches mixing folding and reading sequences (speculative
    schedules add S_hi reads without a fold and folds of a token that read the read copy)."""
    cfg = ReplayConfig.parse(text)
    inputs = make_inputs(batch=2, seqlen=2, dtype=torch.float32, decay=0.5, device=device, **AWKWARD)
    # window: the second sequence folds at step 0, none at step 1; speculative: the first reads S_hi without a fold,
    # the second folds at step 1 after reading the read copy
    counts = [1, 3] if cfg.speculative is None else [0, 1]
    state = _phased_state(cfg, inputs[5], AWKWARD["heads"], counts, read_hi=[True, False])
    monkeypatch.setattr(gdn_triton, "_step", _no_general_step)
    if launch is not None:
        monkeypatch.setattr(gdn_triton, "step_launch_config", lambda *a: _STEP_LAUNCHES[launch])
    exact_hi = cfg.recur == "fp32"
    for n in range(2):
        x = cut(inputs, n, n + 1)
        o_ref, ref = decode_reference(*x, state, cfg)
        o, state = gdn_triton.decode_step_triton(*x, state, cfg)
        assert_close(f"o[{n}]", o_ref, o, 1e-5)
        assert_close(f"buffer u[{n}]", ref.buffer["u"], state.buffer["u"], 1e-5)
        assert torch.equal(ref.checkpoint, state.checkpoint)
        if exact_hi:
            assert_close(f"S_hi[{n}]", ref.hi, state.hi, 1e-5)
        else:
            _mostly_equal(f"S_hi[{n}]", ref.hi, state.hi)
        _mostly_equal(f"S_lo[{n}]", ref.lo, state.lo)
    assert state.checkpoint.tolist() == [0, 1]


def test_replay_step_kernel_k128(device):
    """The single-token kernel at Qwen3.5-4B's head size (K = V = 128, default launch), NVFP4 read: one sequence
    folds while the other reads the packed copy."""
    cfg = ReplayConfig.parse("nvfp4:scale=head/fp32@4")
    inputs = make_inputs(seqlen=1, dtype=torch.float32, device=device, **dict(QWEN_HEAD, batch=2))
    state = _phased_state(cfg, inputs[5], QWEN_HEAD["heads"], [1, 3], read_hi=[False, False])
    o_ref, ref = decode_reference(*inputs[:5], state, cfg)
    o, state = gdn_triton.decode_step_triton(*inputs[:5], state, cfg)
    assert_close("o", o_ref, o, 1e-5)
    assert_close("S_hi", ref.hi, state.hi, 1e-5)
    assert state.checkpoint.tolist() == [0, 1]

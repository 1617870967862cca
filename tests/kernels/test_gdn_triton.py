"""GDN's own Triton kernel paths against the torch reference (TRITON_INTERPRET=1 on CPU; tests/conftest.py sets it),
on the device under test (`REPLAYSSM_TEST_DEVICE=cuda` runs the compiled kernels): the chunked kernel at K = V = 128,
in blocks of segments and with copies rounded by torch, and the single-token kernel's launches. What both delta-rule
families share is tested in test_delta_triton.py (the shared checks are in `tests.helpers.kernel_checks`).
"""

import dataclasses

import pytest
import torch

from replayssm_eval.formats.codec import tile_codec
from replayssm_eval.kernels import gdn
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels.delta import triton_chunk as shared
from replayssm_eval.kernels.delta._common import buffer_capacity, buffer_keys, to_format_layout
from replayssm_eval.kernels.gdn import chunked, decode_reference
from replayssm_eval.kernels.gdn import triton_chunk as gdn_chunk
from replayssm_eval.kernels.gdn import triton_step as gdn_step
from replayssm_eval.replay.schedule import ScheduleState
from replayssm_eval.replay.state import ReplayState, write_checkpoint_packed

from tests.helpers.compare import assert_close, mostly_equal
from tests.helpers.delta import cut, delta_inputs, phased_start
from tests.helpers.kernel_checks import one_segment_launches, rounds_to, triton_no_fallback

QWEN_HEAD = dict(batch=1, heads=1, value_heads=2, dk=128, dv=128)  # Qwen3.5-4B's head size (K = V = 128), two heads
AWKWARD = dict(heads=2, value_heads=4, dk=24, dv=40)  # grouped heads (HV = 2H), K and V not powers of two


@pytest.mark.parametrize("text", ["nvfp4:scale=row/fp16sr@16", "nvfp4:scale=head/fp8sr@16#closed"])
def test_chunked_triton_lockstep_k128(text, device):
    """Quantized chunked at K = V = 128, one checkpoint at a time from identical stored copies (what
    benchmarks/gpu_check_delta.py judges on the GPU): outputs and pre-round folds agree to FP32 accuracy, the kernel's
    stored copies are exactly `write_checkpoint` of its own pre-round fold, and only a few rounding decisions differ
    from the torch path's (the free-running runs then diverge by the format's noise: not a kernel error)."""
    cfg = ReplayConfig.parse(text)
    c32 = dataclasses.replace(cfg, read="fp32", recur="fp32")  # same window and fold: write_checkpoint is the identity
    inputs = delta_inputs("gdn", seqlen=32, dtype=torch.float32, decay=0.3, device=device, **QWEN_HEAD)
    prep = lambda x, st: gdn.RULE.prepare(*x, st, cfg, layer_idx=0, seq_ids=None, compute_dtype=torch.float32)  # noqa: E731
    state = prep(cut(inputs, 0, 1), inputs[5]).state  # checkpoint 0 as a ReplayState
    for w in (0, 16):
        x = cut(inputs, w, w + 16)
        o_t, st_t = chunked(*x, state, cfg)
        o_k, st_k = chunked(*x, state, cfg, backend="triton")
        assert_close(f"o[{w}:]", o_t, o_k, 1e-5)
        _, f_t = chunked(*x, state, c32)
        _, f_k = gdn_chunk.chunked_triton(prep(x, state), rounded=False)
        assert_close(f"pre-round fold {w}", f_t.hi, f_k.hi, 1e-5)
        assert rounds_to(f_k, st_k, cfg), "in-kernel rounding != write_checkpoint of the kernel's fold"
        for name, ref, got in (("S_hi", st_t.hi, st_k.hi), ("S_lo", st_t.lo, st_k.lo)):
            mostly_equal(f"{name} after window {w}", ref, got, 0.99, noise=1e-6 * (ref.abs() + ref.abs().max()))
        state = st_t


@pytest.mark.parametrize("text", ["fp32/fp32@4#closed", "fp32/fp32@3#skip=0.6", "nvfp4:scale=row/fp16sr@4#closed#skip=0.6",
                                  "fp8sr/fp16@3", "shared:fp16sr@4#spec=3:0.6#closed"])
def test_chunked_triton_blocks(text, device, monkeypatch):
    """Awkward sizes (grouped heads, K = 24, V = 40 in two v-blocks, one segment per launch block), from carried
    buffers at differing phases: == decode_reference (FP32 formats) and the torch backend (outputs to FP32 accuracy,
    stored copies all but a few flipped roundings, the same checkpoints), and the stored copies are exactly
    `write_checkpoint` of the kernel's own pre-round fold."""
    cfg = ReplayConfig.parse(text)
    inputs = delta_inputs("gdn", batch=2, seqlen=10, dtype=torch.float32, device=device, **dict(AWKWARD, heads=1, value_heads=2))
    start = phased_start("gdn", inputs, cfg, warmup=(0, 3), dtype=torch.float32)
    x = cut(inputs, 3)
    o_t, st_t = chunked(*x, start, cfg)
    monkeypatch.setattr(shared, "chunked_launch_config",
                        lambda *args: {"BV": 32, "num_warps": 4, "DOT": "ieee"})
    with one_segment_launches():
        o_k, st_k = chunked(*x, start, cfg, backend="triton")
    assert torch.equal(st_t.checkpoint, st_k.checkpoint) and int((st_k.checkpoint - start.checkpoint).min()) >= 1
    if cfg.recur == "fp32":
        o_ref, st_ref = decode_reference(*x, start, cfg)
        assert_close("o", o_ref, o_k, 1e-5)
        assert_close("S_hi", st_ref.hi, st_k.hi, 1e-5)
        for name in st_ref.buffer:
            assert_close(f"buffer[{name!r}]", st_ref.buffer[name], st_k.buffer[name], 1e-5)
    assert_close("o vs torch", o_t, o_k, 1e-5 if cfg.recur == "fp32" else 2e-3)
    mostly_equal("S_hi vs torch", st_t.hi, st_k.hi)
    mostly_equal("S_lo vs torch", st_t.lo, st_k.lo)
    _assert_first_fold_rounds_exactly(inputs, cfg)


def _assert_first_fold_rounds_exactly(inputs, cfg):
    """Through the first fold from a common state, the stored copies are bit for bit `write_checkpoint` of the
    kernel's own pre-round fold (rounded in the kernel or by torch; both runs launch the same kernel variant)."""
    prep = lambda n, st: gdn.RULE.prepare(*cut(inputs, 0, n), st, cfg, layer_idx=0, seq_ids=None, compute_dtype=torch.float32)  # noqa: E731
    state = prep(1, inputs[5]).state
    n = int(prep(None, state).plan.fold_after[0].nonzero()[0]) + 1
    with one_segment_launches():
        _, rounded = gdn_chunk.chunked_triton(prep(n, state))
        _, fold = gdn_chunk.chunked_triton(prep(n, state), rounded=False)
    assert rounds_to(fold, rounded, cfg), "stored copies != write_checkpoint of the kernel's fold"


# copies no program can round (tensor-wide scales, tiles of other sizes); the sequences start 3 tokens apart, so @3 folds
# both in the same segments and the other windows fold one without the other
SLOW = pytest.mark.slow  # the same paths as the unmarked cases, with another format or option


@pytest.mark.parametrize("text", [
    "shared:nvfp4:scale=tensor@4", "nvfp4:scale=tensor/fp16sr@4", pytest.param("nvfp4:scale=tensor/fp32@4#closed", marks=SLOW),
    "shared:fp8:scale=tensor@4", pytest.param("fp8sr:scale=tensor/fp32@5#skip=0.6", marks=SLOW),
    pytest.param("nvfp4:axis=headdim,scale=tensor/fp16sr@4", marks=SLOW),
    pytest.param("fp16/nvfp4:scale=tensor@3#closed", marks=SLOW),
    pytest.param("nvfp4:scale=tensor/nvfp4:axis=headdim@4#spec=3:0.6", marks=SLOW),
    # tensor scales and tiles of other than power-of-two sizes, rotated or not (`tile_codec` None)
    pytest.param("int8:axis=headdim,scale=tile:3x8,rot=hadamard:8/fp32@4", marks=SLOW),
    pytest.param("nvfp4:scale=tensor,rot=hadamard:8/fp32@4#closed", marks=SLOW),
    pytest.param("shared:int16sr:scale=tensor,bits=8@4", marks=SLOW),
    pytest.param("fp8:scale=block:16,max=240/fp8sr:scale=tensor,rounds=7,bits=8@4", marks=SLOW),
    "shared:fp8:scale=tile:4x12,max=240@4",
    pytest.param("int8:scale=tile:8x6/fp32@4", marks=SLOW)])
def test_chunked_triton_torch_rounded_copies(text, device):
    """Copies in formats no program can round run on Triton, one segment per launch with that copy rounded by torch.
    Awkward sizes, sequences at different phases, three calls in a row, each from its own backend's state: == the
    torch backend (outputs to the quantized tolerance, stored copies all but a few flipped roundings, the same
    checkpoints and buffers), == decode_reference where the recurrence is FP32, and the stored copies are exactly
    `write_checkpoint` of the kernel's own fold."""
    cfg = ReplayConfig.parse(text)
    assert None in (tile_codec(cfg.recur_format), tile_codec(cfg.read_format))
    inputs = delta_inputs("gdn", batch=2, seqlen=17, dtype=torch.float32, device=device, **AWKWARD)
    ref = tri = start = phased_start("gdn", inputs, cfg, warmup=(0, 3), dtype=torch.float32)
    for first, stop in ((3, 9), (9, 10), (10, 17)):
        x = cut(inputs, first, stop)
        o_t, ref = chunked(*x, ref, cfg)
        o_k, tri = triton_no_fallback(chunked, *x, tri, cfg)
        assert_close(f"o[{first}:{stop}] vs torch", o_t, o_k, 2e-3)
        mostly_equal("S_hi vs torch", ref.hi, tri.hi)
        mostly_equal("S_lo vs torch", ref.lo, tri.lo)
        assert torch.equal(ref.checkpoint, tri.checkpoint)
        for name in ref.buffer:
            assert_close(f"buffer[{name!r}]", ref.buffer[name], tri.buffer[name], 2e-3)
        if cfg.shared:
            assert tri.lo is tri.hi
    assert int((tri.checkpoint - start.checkpoint).min()) >= 2
    if cfg.recur == "fp32":
        o_ref, st_ref = decode_reference(*cut(inputs, 3), start, cfg)
        o_k, st_k = triton_no_fallback(chunked, *cut(inputs, 3), start, cfg)
        assert_close("o vs decode_reference", o_ref, o_k, 1e-5)
        assert_close("S_hi vs decode_reference", st_ref.hi, st_k.hi, 1e-5)
    _assert_first_fold_rounds_exactly(inputs, cfg)


@pytest.mark.parametrize("text, by_torch", [
    ("nvfp4:scale=row/fp16sr@4", "read"),
    pytest.param("fp8sr/fp16sr@4#closed#skip=0.6", "recur", marks=SLOW),
    pytest.param("shared:fp16sr@4#spec=3:0.6#closed", "recur", marks=SLOW),
    ("fp8sr/nvfp4:scale=row@4", "read/recur"),
    ("int16:order=mul/int8sr@4", "read/recur"),
    pytest.param("fp16sr/mxfp8@4#closed", "recur", marks=SLOW),
    pytest.param("int8sr:scale=block:16/fp8:scale=tile:16x0,max=240@4", "read/recur", marks=SLOW),
    # along V, rotated
    pytest.param("int8:axis=headdim,scale=block:8,rot=hadamard:8/mxfp4:axis=headdim@4", "read/recur", marks=SLOW),
    ("mx8sr/mx8:axis=headdim@4", "read/recur"),  # MX8 blocks of 16 along K = 24 and V = 40, the last ones short
    ("dualaxis:width=8/dualaxis:axis=dstate@4", "read/recur"),  # dual-axis factors over V = 40 or K = 24
    pytest.param("stepquant:dualaxis6", "recur", marks=SLOW),  # window 1: one-row windows
])
def test_torch_rounding_equals_in_kernel(text, by_torch, device, monkeypatch):
    """The torch rounding between one-segment launches, forced on formats the kernel rounds: outputs, stored copies,
    checkpoints and buffers bit for bit those of the in-kernel rounding with one-segment launches too (same folds;
    the torch rounding uses the kernel's keys, Philox counters and checkpoint indices, SR included)."""
    cfg = ReplayConfig.parse(text)
    inputs = delta_inputs("gdn", batch=2, seqlen=12, dtype=torch.float32, device=device, **AWKWARD)
    start = phased_start("gdn", inputs, cfg, warmup=(0, 3), dtype=torch.float32)
    x = cut(inputs, 3)
    dims = (AWKWARD["dv"], AWKWARD["dk"])
    assert None not in (tile_codec(cfg.recur_format, dims=dims), tile_codec(cfg.read_format, dims=dims)), \
        "the kernel must round both copies"
    with one_segment_launches():
        o_in, st_in = chunked(*x, start, cfg, backend="triton")
    forced = [getattr(cfg, f"{copy}_format") for copy in by_torch.split("/")]
    monkeypatch.setattr(shared, "tile_codec", lambda fmt, whole_head, dims:
                        None if fmt in forced else tile_codec(fmt, whole_head, dims))
    assert shared.tile_codec(cfg.recur_format if by_torch == "recur" else cfg.read_format, True, None) is None
    o_out, st_out = triton_no_fallback(chunked, *x, start, cfg)
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
                  {"BLOCK_V": 16, "BLOCK_K": 32, "TILES": 2, "num_warps": 1},  # 2nd program: a part tile, a padding tile
                  {"BLOCK_V": 64, "BLOCK_K": 32, "TILES": 1, "WORDS": 1, "num_warps": 4},  # one tile, codes as words
                  {"BLOCK_V": 32, "BLOCK_K": 16, "TILES": 2, "WORDS": 2, "num_warps": 1}]  # a row a thread, 2nd tile part


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
    ("nvfp4/fp32@4", 2),
    ("nvfp4:scale=row/fp32@4#closed#skip=0.5", 2),
    ("nvfp4/fp32@4", 3),
    ("nvfp4:scale=tensor/fp32@4#closed#skip=0.5", 3),
    ("nvfp4:axis=headdim/fp32@4", 1),
    ("shared:fp8sr@4#closed", 0),
    ("nvfp4:scale=row/fp32@4#spec=3:0.6", 1),
    ("fp8/fp32@4#spec=3:0.6#closed#skip=0.5", 0),
    ("int8/fp32@4", 1),
    ("shared:int16sr:scale=head@4", 0),
])
def test_replay_step_kernel_matches_reference(text, launch, device, monkeypatch):
    """decode_step_triton (`_replay_step_kernel` only) == decode_reference, step by step from the same state: sequences
    at different phases, so launches without folds and launches mixing folding and reading sequences (speculative
    schedules add S_hi reads without a fold and folds of a token that read the read copy)."""
    cfg = ReplayConfig.parse(text)
    inputs = delta_inputs("gdn", batch=2, seqlen=2, dtype=torch.float32, decay=0.5, device=device, **AWKWARD)
    # window: the second sequence folds at step 0, none at step 1; speculative: the first reads S_hi without a fold,
    # the second folds at step 1 after reading the read copy
    counts = [1, 3] if cfg.speculative is None else [0, 1]
    state = _phased_state(cfg, inputs[5], AWKWARD["heads"], counts, read_hi=[True, False])
    monkeypatch.setattr(gdn_step, "_step", _no_general_step)
    if launch is not None:
        monkeypatch.setattr(gdn_step, "step_launch_config", lambda *a: _STEP_LAUNCHES[launch])
    exact_hi = cfg.recur == "fp32"
    for n in range(2):
        x = cut(inputs, n, n + 1)
        o_ref, ref = decode_reference(*x, state, cfg)
        o, state = gdn.decode_step_triton(*x, state, cfg)
        assert_close(f"o[{n}]", o_ref, o, 1e-5)
        assert_close(f"buffer u[{n}]", ref.buffer["u"], state.buffer["u"], 1e-5)
        assert torch.equal(ref.checkpoint, state.checkpoint)
        if exact_hi:
            assert_close(f"S_hi[{n}]", ref.hi, state.hi, 1e-5)
        else:
            mostly_equal(f"S_hi[{n}]", ref.hi, state.hi)
        mostly_equal(f"S_lo[{n}]", ref.lo, state.lo)
    assert state.checkpoint.tolist() == [0, 1]


def test_replay_step_kernel_k128(device):
    """The single-token kernel at Qwen3.5-4B's head size (K = V = 128, default launch), NVFP4 read: one sequence
    folds while the other reads the packed copy."""
    cfg = ReplayConfig.parse("nvfp4:scale=head/fp32@4")
    inputs = delta_inputs("gdn", seqlen=1, dtype=torch.float32, device=device, **dict(QWEN_HEAD, batch=2))
    state = _phased_state(cfg, inputs[5], QWEN_HEAD["heads"], [1, 3], read_hi=[False, False])
    o_ref, ref = decode_reference(*inputs[:5], state, cfg)
    o, state = gdn.decode_step_triton(*inputs[:5], state, cfg)
    assert_close("o", o_ref, o, 1e-5)
    assert_close("S_hi", ref.hi, state.hi, 1e-5)
    assert state.checkpoint.tolist() == [0, 1]

"""Mamba-2 Triton kernels against the torch reference (TRITON_INTERPRET=1 on CPU, see tests/conftest.py).

Tolerances: the kernels sum in FP32 in their own order (tl.dot, tl.cumsum), so outputs match the
reference to ~1e-6 relative; a state within an ulp of a rounding boundary may round the other way
(see `assert_close`). The in-loop quantizers themselves are checked bit for bit: the copies the
kernel rounds must equal the formats library's rounding of the kernel's own FP32 fold.
"""

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import tile_codec
from replayssm_eval.formats.device import (
    E2M1_F16_SCALE, e2m1_decode, e2m1_f16, e2m1_f16_hi, e2m1_f16_pair, e4m3_decode, e4m3_fast, e5m2_decode, e5m2_fast,
)
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.state import write_checkpoint
from replayssm_eval.kernels.mamba2 import chunked, decode_reference
from replayssm_eval.kernels.mamba2 import triton_chunk, triton_phases, triton_step, triton_tokens
from replayssm_eval.kernels.mamba2.triton_step import decode_step_triton, verify_triton

from tests.helpers.compare import RESIDUAL_FLIP, assert_bits_equal, assert_close, mostly_equal
from tests.helpers.device import TEST_DEVICE
from tests.helpers.kernel_checks import triton_no_fallback
from tests.helpers.mamba2 import mamba2_inputs, phased_state, sliced
from tests.helpers.replay import state_to

# the interpreter reports 1/0 in numpy; the kernels handle it as the formats specify (FLT_MAX clamps)
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def _small(**kw):
    return mamba2_inputs(**{"batch": 2, "tokens": 13, "heads": 3, "head_dim": 20, "d_state": 24, "dtype": torch.float32,
                          "seed": 3, **kw})


def _phased(inputs, config, pre, device):
    """`phased_state` on the CPU reference, moved to `device`: sequences at different phases with carried buffers."""
    return state_to(phased_state(decode_reference, tuple(t.cpu() for t in inputs), config, pre, torch.float32), device)


@pytest.mark.parametrize("text, groups, d_state", [
    ("shared:fp16sr@1", 1, 24),
    ("shared:nvfp4:scale=row@4#skip=0.4", 3, 24),
    ("nvfp4:scale=head/fp8sr@4", 1, 24),
    ("nvfp4/fp16sr@4", 3, 24),  # the default: a head-scaled read copy over two P tiles, from the amax pass
    pytest.param("int8:scale=head,order=mul/fp16sr@3", 1, 24, marks=pytest.mark.slow),
    ("fp16/fp8sr:scale=head@8#spec=3:0.6", 3, 24),
    ("int8/int16sr:scale=head@4", 3, 24),
    ("vllm:int16sr", 3, 23),  # one Philox call per 4 elements (words=quad), the last group of a row partial
    ("flashinfer:int16", 1, 24),
    ("sglang:fp8", 3, 24),
    pytest.param("pimba:int8sr", 1, 24, marks=pytest.mark.slow),  # blocks along d_state: quick below, bit for bit
    # fp16sr's engine word layouts at an odd d_state, whose pairs end a row unpaired
    ("fp16sr:words=pair/fp16sr:words=quad,cvt=soft@3", 3, 23),
    ("shared:fp16sr:words=octet@3#buf=bf16", 1, 23),
    # along head_dim (P = 20: the whole head, blocks of 8 the last one short) and rotated along P or d_state
    ("nvfp4:axis=headdim/int8sr:axis=headdim,scale=block:8,rot=hadamard:4@4", 3, 24),
    # two-axis scales (column factors over the whole head) along d_state and head_dim
    ("nvfp4:scale=rowcol/int16sr:axis=headdim,scale=rowcol,order=mul@4", 3, 24),
    ("shared:fp8sr:axis=headdim,max=240@4", 1, 24),
    pytest.param("int8:rot=hadamard:8/mxfp4:axis=headdim@4", 1, 24, marks=pytest.mark.slow),
    # dual-axis factors over the whole head (C = head_dim 20 or d_state 24; STEPQuant's window-1 preset: bit for bit
    # in test_torch_rounding_equals_in_loop_rounding, as a factor that FP32 noise flips moves a whole row or column)
    ("dualaxis/dualaxis:axis=dstate,width=8@4", 3, 24),
])
def test_chunked_triton_matches_torch(text, groups, d_state, device):
    config = ReplayConfig.parse(text)
    assert None not in triton_chunk._codecs(config, (20, d_state)), "both copies must be rounded in the loop"
    inputs = tuple(t.to(device) for t in _small(groups=groups, d_state=d_state))
    state = _phased(inputs, config, [0, 3], device)
    main = sliced(inputs, 3, 13)[:6]
    y_ref, st_ref = chunked(*main, state, config)
    y, st = triton_no_fallback(chunked, *main, state, config)
    assert_close("y", y_ref, y, 1e-5, flips=0.01)
    assert_close("hi", st_ref.hi, st.hi, 1e-5, flips=0.01)
    assert_close("lo", st_ref.lo, st.lo, 1e-5, flips=0.01)
    assert torch.equal(st.checkpoint, st_ref.checkpoint) and st.checkpoint.min() >= 1
    # bit-exact in-loop quantization: the packed read copy is the formats library's rounding of the kernel's fold
    assert torch.equal(config.read_format.decode(st.lo_packed), st.lo)
    if config.shared:
        assert torch.equal(st.hi, st.lo)


@pytest.mark.parametrize("text, groups, d_state", [
    ("nvfp4:scale=tensor/fp32@4", 3, 24),
    ("nvfp4:scale=tensor/fp16sr@3#skip=0.4", 1, 40),
    ("nvfp4:axis=headdim,scale=tensor/fp32@4", 3, 24),
    ("fp8sr:scale=tensor/fp32@4", 3, 24),
    ("shared:nvfp4:scale=tensor@4", 3, 24),
    ("shared:fp8:scale=tensor@4#skip=0.4", 1, 40),
    ("fp16sr/fp8sr:scale=tensor@4", 3, 24),
    ("fp32/nvfp4:axis=headdim,scale=tensor@3", 1, 24),
    ("nvfp4:scale=tensor/nvfp4:scale=tensor@4#spec=3:0.6", 3, 24),
    ("fp16/int8:scale=tile:4x6@4", 1, 24),
    # tensor scales and tiles of other than power-of-two sizes, rotated or not (`tile_codec` None)
    ("int8:rot=hadamard:8/int16sr:scale=tensor,rounds=7,bits=8@4", 1, 24),
    ("shared:fp8sr:axis=headdim,scale=tile:2x6,max=240@4", 1, 24),
    ("int8:scale=tile:3x5/fp16sr@4", 3, 24),
])
def test_chunked_triton_torch_rounded_matches_torch(text, groups, d_state, device):
    """Copies in formats no program can round (tensor scale, tiles of other than power-of-two sizes, no kernel codec)
    run on Triton, rounded by torch: a read copy after the kernel, a recurrence copy (or shared checkpoint) between
    one-segment launches. Three calls in a row, each from its own backend's state, sequences at different phases."""
    config = ReplayConfig.parse(text)
    assert None in triton_chunk._codecs(config, (20, d_state)), "a copy must be rounded by torch"
    inputs = tuple(t.to(device) for t in _small(groups=groups, d_state=d_state, tokens=15))
    ref = tri = _phased(inputs, config, [0, 2], device)
    for start, stop in ((2, 7), (7, 8), (8, 15)):
        part = sliced(inputs, start, stop)[:6]
        y_ref, ref = chunked(*part, ref, config)
        y, tri = triton_no_fallback(chunked, *part, tri, config)
        assert_close(f"y[{start}:{stop}]", y_ref, y, 1e-5, flips=0.01)
        assert_close("hi", ref.hi, tri.hi, 1e-5, flips=0.01)
        assert_close("lo", ref.lo, tri.lo, 1e-5, flips=0.01)
        assert torch.equal(tri.checkpoint, ref.checkpoint)
        assert all(torch.equal(tri.buffer[k], ref.buffer[k]) for k in ref.buffer)
        assert torch.equal(config.read_format.decode(tri.lo_packed), tri.lo)
        if config.shared:
            assert torch.equal(tri.hi, tri.lo)
    assert tri.checkpoint.min() >= 2


@pytest.mark.skipif(TEST_DEVICE != "cuda", reason="programs exchange a head's amax only when they run at once (a GPU)")
@pytest.mark.parametrize("text", [
    "shared:nvfp4@4", "fp16sr/int8:scale=head,order=mul@3",
    "int8:scale=head/fp8sr:scale=head@4",  # both copies exchange at each fold
])
def test_head_scale_across_programs(text, device, monkeypatch):
    """A head-scaled recurrence copy held by the head's three 16-row programs (head_dim 40, the last tile short),
    which exchange its amax at each fold: the outputs and copies of programs holding the whole head up to FP32 flips,
    and the packed read copy the formats library's rounding of the kernel's fold."""
    config = ReplayConfig.parse(text)
    inputs = tuple(t.to(device) for t in _small(head_dim=40, tokens=15))
    state = _phased(inputs, config, [0, 2], device)
    main = sliced(inputs, 2, 15)[:6]
    chosen = []
    exchange = triton_chunk.exchange_programs
    monkeypatch.setattr(triton_chunk, "exchange_programs", lambda *args: chosen.append(exchange(*args)) or chosen[-1])
    y, st = triton_no_fallback(chunked, *main, state, config)
    assert chosen == [3]
    assert torch.equal(config.read_format.decode(st.lo_packed), st.lo) and st.checkpoint.min() >= 2
    monkeypatch.setattr(triton_chunk, "exchange_programs", lambda *args: 1)
    y_one, st_one = triton_no_fallback(chunked, *main, state, config)
    assert_close("y", y_one, y, 1e-5, flips=0.02)
    mostly_equal("S_hi", st_one.hi, st.hi)
    mostly_equal("S_lo", st_one.lo, st.lo)
    assert torch.equal(st.checkpoint, st_one.checkpoint)


# head_dim 40: two 32-row tiles (the second short) in a program holding the whole head; d_state 40: MX blocks of 32
# and blocks of 16, the last one short
_WIDE = {"head_dim": 40, "d_state": 40}


@pytest.mark.parametrize("text, by_torch, sizes", [
    ("nvfp4:scale=row/fp16sr@4", "read", {}),
    ("fp8sr:scale=row/fp32@3#skip=0.4", "read", {}),
    ("fp16/fp8sr:scale=row@3", "recur", {}),
    ("shared:fp16sr@4#skip=0.4", "recur", {}),
    pytest.param("nvfp4:scale=row/fp16sr@3#spec=3:0.6", "read/recur", {}, marks=pytest.mark.slow),
    ("int16:order=mul/int8sr:scale=head@3", "read/recur", {}),
    pytest.param("fp16sr/mxfp4@4", "recur", _WIDE, marks=pytest.mark.slow),
    pytest.param("fp8:scale=tile:32x0,max=240/int16:scale=tile:4x8,order=mul@3", "read/recur",
                 _WIDE, marks=pytest.mark.slow),
    # engine word layouts
    pytest.param("fp16sr:words=pair/fp16sr:words=quad,cvt=soft@3", "read/recur", {"d_state": 23},
                 marks=pytest.mark.slow),
    ("shared:fp16sr:words=octet@3#buf=bf16", "recur", {"d_state": 23}),
    # the same paths with other scale tiles: blocks, 8-row tiles in 16-row programs (the last short)
    pytest.param("int8sr:scale=block:16/fp32@3", "read", _WIDE, marks=pytest.mark.slow),
    pytest.param("shared:fp8:scale=tile:8x0,max=240@4#skip=0.4", "recur", {}, marks=pytest.mark.slow),
    pytest.param("mxfp8/int8:scale=block:8@4", "read/recur", {}, marks=pytest.mark.slow),
    # modelopt:int8-hadamard's format (blocks of 32 along head_dim 32, rotated by H_32 along it); mxfp4 along head_dim
    ("shared:int8:axis=headdim,scale=block:32,rot=hadamard:32@3", "recur", {"head_dim": 32}),
    pytest.param("mxfp4:axis=headdim/fp8:axis=headdim,scale=head,rot=hadamard:8@3", "read/recur",
                 _WIDE, marks=pytest.mark.slow),
    # blocks and runs of 8 and 16 along head_dim 32 held by programs of 16 rows (two per head)
    ("int8:axis=headdim,scale=block:8,rot=hadamard:8/fp8sr:axis=headdim,scale=block:16,rot=hadamard:16@3",
     "read/recur", {"head_dim": 32}),
    # MX8 blocks of 16 along d_state 40 and head_dim 40 (programs of 16 rows; the last block short)
    pytest.param("mx8sr/mx8sr:axis=headdim@3", "read/recur", _WIDE, marks=pytest.mark.slow),
    # two-axis scales: column factors over head_dim 40 or d_state 40 (programs holding the whole head)
    pytest.param("fp8sr:scale=rowcol/nvfp4:axis=headdim,scale=rowcol@3", "read/recur", _WIDE, marks=pytest.mark.slow),
    # SR with non-default rounds= and bits= (stored copies: keyed Philox4x32-10 words, bits= of them)
    pytest.param("fp16sr:words=octet,rounds=7,bits=8/int8sr:scale=block:8,bits=5@3", "read/recur",
                 {"d_state": 23}, marks=pytest.mark.slow),
    pytest.param("fp8sr:bits=20/mx8sr:axis=headdim,bits=32@3", "read/recur", _WIDE, marks=pytest.mark.slow),
    # dual-axis factors over head_dim 40 or d_state 40 (programs holding the whole head); STEPQuant's preset
    ("dualaxis:width=3/dualaxis:axis=dstate,width=8@3", "read/recur", _WIDE),
    pytest.param("stepquant:dualaxis6", "recur", {}, marks=pytest.mark.slow),
])
def test_torch_rounding_equals_in_loop_rounding(text, by_torch, sizes, device, monkeypatch):
    """The torch roundings forced on formats the loop can round (read copy in blocks of 2 segments, recurrence copy
    between one-segment launches): both copies and the packed read copy bit for bit those of the in-loop rounding
    (same folds; the torch rounding uses the same keys, counters and checkpoint indices, SR included)."""
    config = ReplayConfig.parse(text)
    inputs = tuple(t.to(device) for t in _small(tokens=12, **sizes))
    state = _phased(inputs, config, [0, 1], device)
    main = sliced(inputs, 1, 12)[:6]
    assert None not in triton_chunk._codecs(config, state.hi.shape[2:]), "both copies must be rounded in the loop"
    y_in, st_in = chunked(*main, state, config, backend="triton")
    forced = [getattr(config, f"{copy}_format") for copy in by_torch.split("/")]
    monkeypatch.setattr(triton_chunk, "tile_codec",
                        lambda fmt, dims: None if fmt in forced else tile_codec(fmt, dims=dims))
    heads, head_dim, d_state = state.hi.shape[1:]
    by_copy = [config.recur_format in forced, config.read_format in forced]
    assert [k is None for k in triton_chunk._codecs(config, (head_dim, d_state))] == by_copy
    monkeypatch.setattr(triton_chunk, "_FOLD_BLOCK_ELEMENTS", 2 * 2 * heads * head_dim * d_state)
    y_out, st_out = triton_no_fallback(chunked, *main, state, config)
    assert_close("y", y_in, y_out, 1e-5)
    assert torch.equal(st_out.hi, st_in.hi) and torch.equal(st_out.lo, st_in.lo)
    assert torch.equal(st_out.checkpoint, st_in.checkpoint) and st_in.checkpoint.min() >= 2
    for f in ("data", "scales", "global_scale"):
        a, b = getattr(st_in.lo_packed, f), getattr(st_out.lo_packed, f)
        assert (a is None and b is None) or torch.equal(a, b), f


@pytest.mark.parametrize("text, sizes", [
    ("nvfp4/fp16sr@4", {}),  # the default: S_hi in fold tiles of 32 columns (d_state 24: one, short)
    # d_state 40: two fold tiles, the last short; head_dim 40: three row tiles
    pytest.param("nvfp4/fp16sr@3#skip=0.4", _WIDE, marks=pytest.mark.slow),
    # row-scaled S_hi: fold programs hold whole rows
    pytest.param("fp8sr:scale=head/int8:scale=row,order=mul@4", _WIDE, marks=pytest.mark.slow),
    ("int8:scale=head,order=mul/fp16sr:words=pair@3#buf=bf16", {"d_state": 23}),
    pytest.param("nvfp4/fp16sr@1", {}, marks=pytest.mark.slow),  # one-token windows
    pytest.param("nvfp4/fp16sr@4#spec=3:0.6", {}, marks=pytest.mark.slow),  # speculative plans: tokens that read S_hi
    ("nvfp4/int16:scale=tensor@3", {}),  # S_hi by torch between one-segment launches
    ("nvfp4/mx8sr:axis=headdim,bits=5@4", {"head_dim": 40}),  # MX8 blocks of 16 along head_dim 40
    ("nvfp4/int8:ef=bf16@3", _WIDE),  # the recurrence copy's error-feedback residual through the fold chain
])
def test_phases_equal_one_loop(text, sizes, device, monkeypatch):
    """The phased scan of a head-scaled read copy (folds, read copies, then every segment's outputs at once) against
    the one-loop kernel's (programs holding the whole head): both copies and the packed read copy bit for bit, outputs
    to FP32 sums. Sequences at different phases; slots for two segments at a time, so that blocks start where a
    sequence has stopped folding."""
    config = ReplayConfig.parse(text)
    inputs = tuple(t.to(device) for t in _small(tokens=14, **sizes))
    state = _phased(inputs, config, [0, 3], device)
    main = sliced(inputs, 3, 14)[:6]
    assert triton_chunk.runs_in_phases(config, state.hi.shape[2:])
    heads, head_dim, d_state = state.hi.shape[1:]
    monkeypatch.setattr(triton_phases, "_SLOT_ELEMENTS", 3 * 2 * heads * head_dim * d_state)
    y, st = triton_no_fallback(chunked, *main, state, config)
    monkeypatch.setattr(triton_chunk, "phased", lambda *args: False)
    y_one, st_one = triton_no_fallback(chunked, *main, state, config)
    assert_close("y", y_one, y, 2e-6)
    assert torch.equal(st.hi, st_one.hi) and torch.equal(st.lo, st_one.lo)
    assert st.residual.keys() == st_one.residual.keys()
    assert all(torch.equal(t, st_one.residual[copy]) for copy, t in st.residual.items())
    assert torch.equal(st.checkpoint, st_one.checkpoint) and st.checkpoint.min() >= 1
    assert st.checkpoint.max() > st.checkpoint.min(), "sequences at different phases"
    for f in ("data", "scales", "global_scale"):
        a, b = getattr(st.lo_packed, f), getattr(st_one.lo_packed, f)
        assert (a is None and b is None) or torch.equal(a, b), f


@pytest.mark.parametrize("text, sizes", [
    ("vllm:int16sr", {}),  # row scales and SR on a shared checkpoint
    ("flashinfer:int16#skip=0.4", {"d_state": 23}),  # FlashInfer's operand order; the short last column tile
    # split copies; three row tiles, the last short
    pytest.param("nvfp4:scale=row/fp16sr:words=pair@1", {"head_dim": 40}, marks=pytest.mark.slow),
    # one-draft steps (tokens that read S_lo); the ring in bf16 (the fold's keys rounded): the full suite
    pytest.param("nvfp4:scale=row/fp16sr@1#spec=1:0.6", {}, marks=pytest.mark.slow),
    pytest.param("fp8sr:scale=row/int8:scale=block:8,order=mul@1#buf=bf16", {}, marks=pytest.mark.slow),
    # runs along head_dim
    pytest.param("shared:int8sr:axis=headdim,scale=block:8,rot=hadamard:8@1", {"head_dim": 32},
                 marks=pytest.mark.slow),
    pytest.param("pimba:mx8sr", _WIDE, marks=pytest.mark.slow),  # MX8 blocks of 16 along d_state 40
    # programs of 32 rows: SGLang's 32-row FP8 tiles, INT8+SR blocks of 32 along head_dim 40 (the last of 8 rows)
    ("sglang:fp8", {"head_dim": 40}),
    # a head under one 32-row tile: 16-row programs alone, the tile cut to them
    pytest.param("sglang:fp8", {"head_dim": 16}, marks=pytest.mark.slow),
    pytest.param("shared:int8sr:axis=headdim,scale=block:32@1", {"head_dim": 40}, marks=pytest.mark.slow),
    # STEPQuant's dual-axis factors: on a GPU three programs exchanging row sums (the last of 8 rows), else one
    ("stepquant:dualaxis6", {"head_dim": 40}),
    pytest.param("dualaxis:width=8/dualaxis@1", {"d_state": 23}, marks=pytest.mark.slow),
])
def test_token_scan_equals_one_loop(text, sizes, device, monkeypatch):
    """One-token windows with the state in registers (`triton_tokens`) against the one loop: both copies and the
    packed read copy bit for bit, outputs to FP32 sums; sequences at different phases."""
    config = ReplayConfig.parse(text)
    inputs = tuple(t.to(device) for t in _small(tokens=11, **sizes))
    state = _phased(inputs, config, [0, 3], device)
    main = sliced(inputs, 3, 11)[:6]
    ran = []
    scan = triton_chunk.scan_tokens
    monkeypatch.setattr(triton_chunk, "scan_tokens", lambda *args: ran.append(1) or scan(*args))
    y, st = triton_no_fallback(chunked, *main, state, config)
    assert ran, "the token scan must run"
    monkeypatch.setattr(triton_chunk, "token_scan_rows", lambda *args: None)
    y_one, st_one = triton_no_fallback(chunked, *main, state, config)
    assert_close("y", y_one, y, 2e-6)
    assert torch.equal(st.hi, st_one.hi) and torch.equal(st.lo, st_one.lo)
    assert torch.equal(st.checkpoint, st_one.checkpoint) and st.checkpoint.max() > st.checkpoint.min() >= 1
    assert all(torch.equal(st.buffer[k], st_one.buffer[k]) for k in st.buffer)
    for f in ("data", "scales", "global_scale"):
        a, b = getattr(st.lo_packed, f), getattr(st_one.lo_packed, f)
        assert (a is None and b is None) or torch.equal(a, b), f


@pytest.mark.parametrize("text, rows", [
    ("vllm:int16sr", 16), ("flashinfer:fp16sr", 16), ("nvfp4:scale=row/fp16sr@1", 16),
    ("nvfp4/fp16sr@1", None),  # a head-scaled read copy: the phases
    ("shared:int8:scale=head@1", None),  # a head scale: the head's programs exchange its amax
    ("fp16sr/int16:scale=tensor@1", None),  # a tensor scale: torch rounds the read copy
    ("shared:fp8:scale=tile:32x0@1", 32), ("sglang:fp8", 32),  # scale tiles of 32 head_dim rows
    ("shared:int8sr:axis=headdim,scale=block:32@1", 32), ("shared:int8:axis=headdim,scale=block:64@1", None),
    ("shared:nvfp4:scale=rowcol@1", None), ("dualaxis:axis=dstate@1", None),  # factors over the whole head
    ("shared:int8:ef=fp32@1", 16), ("fp16/int8:scale=tensor,ef=fp32@1", None),  # error feedback: the residuals too
])
def test_token_rows(text, rows):
    """Which one-token configs the token scan runs (programs of 16 head_dim rows, or 32 where a scale tile, block or
    rotation run spans 32), and which stay with the one loop or phases."""
    config = ReplayConfig.parse(text)
    assert triton_chunk.token_scan_rows(config, (80, 128), 1, torch.device("cpu")) == rows
    assert triton_chunk.token_scan_rows(config, (80, 128), 2, torch.device("cpu")) is None


@pytest.mark.parametrize("text, exchange, rows", [
    ("stepquant:dualaxis6", True, 16), ("stepquant:dualaxis6", False, 128),  # a head's 5 programs, or one
    ("dualaxis/int16sr:scale=row@1", True, 16), ("fp8:scale=tile:32x0/dualaxis:width=8@1", True, 128),  # 32-row tiles
    ("dualaxis:rot=hadamard:8@1", True, None), ("dualaxis:axis=dstate@1", True, None),  # the one loop
])
def test_token_rows_of_dual_axis_factors(text, exchange, rows, monkeypatch):
    """Dual-axis factors along head_dim in the token scan: programs of 16 rows where a head's programs may exchange
    row sums (a GPU holding them at once), else one program holding the whole head (80 rows padded to 128); rotated
    or along d_state, the one loop."""
    monkeypatch.setattr(triton_chunk, "can_exchange", lambda at_once, device: exchange and at_once == 5)
    assert triton_chunk.token_scan_rows(ReplayConfig.parse(text), (80, 128), 1, torch.device("cuda")) == rows


@pytest.mark.parametrize("text, head_dim, tail_rows", [
    ("sglang:fp8", 80, (16, 16)),  # 32-row FP8 tiles: 16 rows past two slabs, a tail launch of 16-row tiles
    ("sglang:fp8", 40, (16, 16)),  # 8 rows past one slab: the tail program's last 8 rows are padding
    ("sglang:fp8", 64, None),  # whole slabs: no tail
    ("sglang:fp8", 56, None),  # 24 rows past one slab: more than a 16-row program holds
    ("sglang:fp8", 16, (16, 16)),  # a head under one slab: the 16-row launch alone
    ("shared:int8sr:axis=headdim,scale=block:32@1", 40, None),  # blocks along head_dim would be cut
    ("vllm:int16sr", 80, None),  # programs of 16 rows already
])
def test_tail_codecs(text, head_dim, tail_rows):
    """Which one-token scans take their last head_dim rows in a second launch of 16-row programs, and the scale tile
    rows the copies' codecs round there."""
    config = ReplayConfig.parse(text)
    codecs = tuple(tile_codec(fmt, dims=(head_dim, 128)) for fmt in (config.recur_format, config.read_format))
    rows = triton_chunk.token_scan_rows(config, (head_dim, 128), 1, torch.device("cpu"))
    tail = triton_tokens.tail_codecs(codecs, head_dim, rows)
    if tail_rows is None:
        assert tail is None
    else:  # only the tile rows change
        assert tuple(c.rows for c in tail) == tail_rows
        assert [dataclasses.replace(t, rows=c.rows) for t, c in zip(tail, codecs)] == list(codecs)


@pytest.mark.parametrize("text, pre, tokens", [
    ("fp16sr:ef=bf16/int8:ef=fp32@4", [5, 6], 3),  # each copy its own residual, in BF16 and FP32
    ("nvfp4:ef=fp32/fp16sr@4", [5, 6], 3),  # a head-scaled read copy with feedback: the one loop, not the phases
    ("nvfp4/fp16sr:ef=bf16@4", [5, 6], 3),  # the default with a recurrence residual: the phases' fold chain
    ("int8:scale=tensor/fp16sr:ef=bf16@4", [5, 6], 3),  # the read copy rounded by torch after the kernel
    ("fp8:ef=bf16/int8:scale=tensor@4", [5, 6], 3),  # the recurrence copy rounded by torch between one-segment launches
    ("shared:int8:ef=fp32@1", [1, 2], 1),  # one-token windows: the token scan, residuals in registers
    ("nvfp4:scale=row,ef=bf16/dualaxis:axis=dstate,ef=fp32@1", [1, 2], 1),  # the one loop's whole-head programs
])
def test_chunked_triton_feedback_rounds_fold_plus_residual(text, pre, tokens, device, monkeypatch):
    """A copy with error feedback (`ef=`) rounds fold + residual in the kernel and keeps the new residual. Each
    sequence folds once in the call, from residuals its prefill left (not zero): both copies and residuals are
    write_checkpoint of the kernel's own FP32 fold with the starting residuals, bit for bit, and the packed read
    copy decodes to S_lo; against the torch chunked form to FP32 flips."""
    config = ReplayConfig.parse(text)
    inputs = tuple(t.to(device) for t in _small(tokens=max(pre) + tokens))
    state = _phased(inputs, config, pre, device)
    assert triton_chunk.feedback_in_kernel(config, state.hi.shape[2:])
    assert triton_chunk.runs_in_phases(config, state.hi.shape[2:]) == (text == "nvfp4/fp16sr:ef=bf16@4")
    residual = {copy: t.clone() for copy, t in state.residual.items()}
    assert residual and all(t.abs().max() > 0 for t in residual.values())
    folds = []
    packed = triton_chunk.write_read_copy_packed
    monkeypatch.setattr(triton_chunk, "write_read_copy_packed", lambda fold, *a: folds.append(fold) or packed(fold, *a))
    main = sliced(inputs, max(pre), max(pre) + tokens)[:6]
    y, st = triton_no_fallback(chunked, *main, state, config)
    assert torch.equal(st.checkpoint, state.checkpoint + 1) and len(folds) == 1
    hi, lo = write_checkpoint(folds[0], config, 0, st.seq_ids, st.checkpoint, residual)
    assert_bits_equal(st.hi, hi)
    assert_bits_equal(st.lo, lo)
    for copy, want in residual.items():
        assert_bits_equal(st.residual[copy], want)
    assert torch.equal(config.read_format.decode(st.lo_packed), st.lo)
    y_ref, st_ref = chunked(*main, state, config)
    assert_close("y", y_ref, y, 1e-5, flips=0.01)
    for copy in residual:  # a residual holds its fold's FP32 noise: the noise of the state, not of the residual
        mostly_equal(f"residual[{copy}]", st_ref.residual[copy], st.residual[copy], noise=1e-5 * st_ref.hi.abs().max(),
                     flip_size=RESIDUAL_FLIP)


def test_rotation_runs_that_do_not_tile_head_dim_are_refused(device):
    """`modelopt:int8-hadamard` at head_dim 20, which runs of 32 do not tile: no program rounds it (`tile_codec`), and
    the torch rounding refuses it with the format's own error, as the torch backend does."""
    config = ReplayConfig.parse("modelopt:int8-hadamard")
    assert triton_chunk._codecs(config, (20, 24)) == (None, None)
    assert None not in triton_chunk._codecs(config, (64, 24))
    inputs = tuple(t.to(device) for t in _small(tokens=4))
    for backend in ("torch", "triton"):
        with pytest.raises(ValueError, match=r"rot=hadamard:32 needs the headdim dim \(20\) to be a multiple of 32"):
            chunked(*inputs, config, backend=backend)


def test_chunked_triton_fp64_runs_torch(device):
    inputs = tuple(t.to(device) for t in _small(tokens=6, dtype=torch.float64))
    with pytest.warns(UserWarning, match="compute in FP32"):
        y, st = chunked(*inputs, "shared:nvfp4@4", backend="triton", compute_dtype=torch.float64)
    y_ref, st_ref = chunked(*inputs, "shared:nvfp4@4", compute_dtype=torch.float64)
    assert torch.equal(y, y_ref) and torch.equal(st.hi, st_ref.hi) and torch.equal(st.lo, st_ref.lo)


@pytest.mark.parametrize("text", ["nvfp4/fp16sr@4", "nvfp4:scale=row/fp32@3", "fp8/fp16sr@4#skip=0.3", "fp16/fp32@2",
                                  "fp16sr:words=pair/fp16sr:words=quad,cvt=soft@3"])
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


@pytest.mark.parametrize("text", ["fp16/int8:axis=headdim@2", "stepquant:dualaxis6"])
def test_decode_step_from_the_anchor_matches_reference(text, device):
    """Steps from the FP32 anchor with a recurrence copy along head_dim, whose decoded S_hi torch writes as a
    transposed view (on a GPU the encoder kernel writes it contiguous): each fold is written where the kernel writes
    it (contiguous), so the copies follow the reference's. Each Triton step starts from the reference's state (on the
    CPU a transposed S_hi after the first flush), so that their FP32 sums in another order do not compound over the
    steps: a dual-axis factor that one of them flips moves a whole column."""
    torch_decodes = device == "cpu"
    x, dt, A, B, C, D, s0 = (t.to(device) for t in _small(tokens=6))
    ref = s0
    for n in range(6):
        prev = ref
        y_ref, ref = decode_reference(*sliced((x, dt, A, B, C, D, s0), n, n + 1)[:6], prev, text)
        y, tri = decode_step_triton(x[:, n], dt[:, n], A, B[:, n], C[:, n], D, prev, text)
        assert_close(f"y[{n}]", y_ref[:, 0], y, 1e-5, flips=0.01)
        assert_close(f"hi[{n}]", ref.hi, tri.hi, 1e-5, flips=0.01)
        assert n == 0 or not (torch_decodes and prev.hi.is_contiguous())
    assert not (torch_decodes and tri.hi.is_contiguous()) and tri.checkpoint.min() >= 3


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


# ---------------------------------------------------------------------------------------------- single-token non-flush kernel


@triton.jit
def _decode_all_codes(out_ptr):
    code = tl.arange(0, 256)
    tl.store(out_ptr + code, e4m3_fast(code.to(tl.uint8)))
    tl.store(out_ptr + 256 + code, e4m3_decode(code.to(tl.uint8)))
    tl.store(out_ptr + 512 + code, e5m2_fast(code.to(tl.uint8)))
    tl.store(out_ptr + 768 + code, e5m2_decode(code.to(tl.uint8)))
    word = tl.zeros([256], dtype=tl.int32)  # nibble j of word w: code (w + j) mod 16, the sign bit included
    for j in tl.static_range(8):
        word = word | (((code + j) & 15) << (4 * j))
    for j in tl.static_range(4):
        lo, hi = e2m1_f16_pair(word, j)
        tl.store(out_ptr + 1024 + 256 * j + code, lo * E2M1_F16_SCALE)
        tl.store(out_ptr + 1024 + 256 * (j + 4) + code, hi * E2M1_F16_SCALE)
    for j in tl.static_range(8):
        tl.store(out_ptr + 3072 + 256 * j + code, e2m1_decode((code + j) & 15))
    tl.store(out_ptr + 5120 + code, e2m1_f16(code & 15) * E2M1_F16_SCALE)  # E2M1 of a byte's nibbles
    tl.store(out_ptr + 5376 + code, e2m1_decode(code & 15))
    tl.store(out_ptr + 5632 + code, e2m1_f16(code) * E2M1_F16_SCALE)  # low nibble of a byte
    tl.store(out_ptr + 5888 + code, e2m1_f16_hi(code) * E2M1_F16_SCALE)
    tl.store(out_ptr + 6144 + code, e2m1_decode(code >> 4))


def test_fast_minifloat_decoders_are_exact(device):
    """The FP16-bit-pattern decoders of the step kernels equal the library decoders on every code (NaN, -0,
    subnormals), E2M1 at each nibble of an int32 word and at the low and high nibble of a byte."""
    out = torch.empty(25 * 256, dtype=torch.float32, device=device)
    _decode_all_codes[(1,)](out)
    out = out.view(25, 256).cpu()
    for fast, ref in ((0, 1), (2, 3), *((4 + j, 12 + j) for j in range(8)), (20, 21), (22, 21), (23, 24)):
        a, b = out[fast], out[ref]
        assert torch.equal(a.isnan(), b.isnan())
        ok = ~b.isnan()
        assert torch.equal(a[ok].view(torch.int32), b[ok].view(torch.int32)), f"decoder row {fast}"
    assert out[12:].isnan().sum() == 0 and (out[12:20] < 0).any() and (out[12:20] == 0.5).any()
    assert (out[24] < 0).any() and (out[21] < 0).any() and (out[24] == 0.5).any()


class _Count:
    """Wraps a module-level launcher function and counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


_LAUNCHES = [{"BLOCK_P": 16, "TILES": 1, "num_warps": 4}, {"BLOCK_P": 8, "TILES": 3, "num_warps": 4},
             {"BLOCK_P": 4, "TILES": 2, "num_warps": 1}]


@pytest.mark.parametrize("text, groups, d_state, launch", [
    ("shared:fp32@8", 1, 24, 0),
    ("nvfp4/fp32@8", 3, 24, 1),
    pytest.param("nvfp4:scale=head/fp16@8", 1, 40, 2, marks=pytest.mark.slow),
    ("nvfp4:scale=row/fp32@8", 3, 9, 1),
    ("fp8/fp32@8", 1, 24, 2),
    ("fp8sr:scale=row/fp32@8", 3, 24, 0),
    ("fp8e5m2/fp32@8", 1, 24, 1),
    ("bf16/fp32@8", 3, 24, 2),
    ("nvfp4/fp32@8#skip=0.4", 3, 24, 0),
    ("nvfp4:axis=headdim/fp32@8", 1, 24, 1),
    ("int8/fp32@8", 3, 24, 0),
    ("int16sr:scale=head/fp32@8", 1, 24, 2),
])
def test_step_kernel_matches_reference(text, groups, d_state, launch, device, monkeypatch):
    """Steps of sequences at different phases (non-flush steps, then mixed steps where one sequence flushes) all run
    `_replay_step_kernel` and match decode_reference, output and folded state."""
    config = ReplayConfig.parse(text)
    inputs = tuple(t.to(device) for t in _small(batch=3, groups=groups, d_state=d_state))
    state = phased_state(decode_reference, inputs, config, [0, 2, 5], torch.float32)
    monkeypatch.setattr(triton_step, "step_launch_config", lambda *a: _LAUNCHES[launch])
    step = _Count(triton_step._replay_step)
    general = _Count(triton_step._replay)
    monkeypatch.setattr(triton_step, "_replay_step", step)
    monkeypatch.setattr(triton_step, "_replay", general)
    x, dt, A, B, C, D, _ = inputs
    tri, ref = state, state
    for n, want_step in zip(range(5, 13), range(1, 9)):
        y_ref, ref = decode_reference(*sliced(inputs, n, n + 1)[:6], ref, config)
        y, tri = decode_step_triton(x[:, n], dt[:, n], A, B[:, n], C[:, n], D, tri, config)
        assert (step.calls, general.calls) == (want_step, 0), f"step {n}"
        assert_close(f"y[{n}]", y_ref[:, 0], y, 1e-5, flips=0.01)
    assert_close("hi", ref.hi, tri.hi, 1e-5, flips=0.01)
    assert_close("lo", ref.lo, tri.lo, 1e-5, flips=0.01)
    assert torch.equal(tri.checkpoint, ref.checkpoint) and tri.checkpoint.min() >= 1
    if tri.lo_packed is not None and not config.shared:
        assert torch.equal(config.read_format.decode(tri.lo_packed), tri.lo)


@pytest.mark.parametrize("text", ["nvfp4:scale=row/fp32@8", "fp8:scale=head/fp32@8#skip=0.7", "fp16/fp32@8"])
# launches 1 and 2: the full suite
@pytest.mark.parametrize("launch", [0, *(pytest.param(n, marks=pytest.mark.slow) for n in (1, 2))])
def test_step_kernel_equals_general_kernel(text, launch, device):
    """Differential test: `_replay_step` = `_replay` (T = 1) row for row, S_hi rows and read-copy rows mixed, without
    and with folding rows (the fold of a row that does not read S_hi included), and with S_hi read exactly where a row
    folds (read_hi None: no per-row flag in either launch)."""
    config = ReplayConfig.parse(text)
    inputs = tuple(t.to(device) for t in _small(batch=4, groups=3, heads=6, head_dim=20, d_state=24))
    state = phased_state(decode_reference, inputs, config, [0, 3, 6, 9], torch.float32)
    buf, count = state.buffer, state.schedule.count.contiguous()
    C = inputs[4][:, 9].contiguous()
    flags = torch.tensor([True, False, True, False], device=device)
    A = inputs[2].contiguous()
    none, some = torch.zeros_like(flags), torch.tensor([True, True, False, False], device=device)
    for read_hi, fold in ((flags, none), (flags, some), (None, none), (None, some), (None, torch.ones_like(some))):
        y_old, f_old = triton_step._replay(buf["x"], buf["B"], buf["dt"], C[:, None].contiguous(), count,
                                             fold if read_hi is None else read_hi, fold, A, state, config)
        y_new, f_new = triton_step._replay_step(buf["x"], buf["B"], buf["dt"], C, count, read_hi, fold, A, state,
                                                  config, launch=_LAUNCHES[launch])
        assert_close("y", y_old[:, 0], y_new, 1e-5)
        assert (f_old is None) == (f_new is None) == (not fold.any())
        if fold.any():
            assert_close("fold", f_old[fold], f_new[fold], 1e-5)

"""Delta-rule Triton kernels (GDN and KDA) against the torch reference (TRITON_INTERPRET=1 on CPU; tests/conftest.py
sets it), on the device under test (`REPLAYSSM_TEST_DEVICE=cuda` runs the compiled kernels).

FP32 compute in two different orders can put a value on either side of a rounding midpoint, so
with quantized formats the stored states are compared for (nearly all) identical elements and
the outputs loosely; the in-kernel rounding itself (`delta.triton_chunk.store_round`, shared by both
families) is checked bit for bit on its own. (The Philox key must reach `tl.randint` as a loaded
int64, as the kernels do: a Python-int kernel argument gave different bits in the interpreter.)
GDN's own kernel paths are tested further in test_gdn_triton.py.
"""

import pytest
import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import tile_codec
from replayssm_eval.formats.device import NVFP4
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.kernels import head_exchange
from replayssm_eval.kernels.delta import triton_chunk as shared
from replayssm_eval.kernels.delta import triton_step as shared_step
from replayssm_eval.kernels.delta._common import to_format_layout
from replayssm_eval.kernels.gdn import triton_step as gdn_step
from replayssm_eval.kernels.kda import triton_step as kda_step
from replayssm_eval.kernels.delta.reference import verify_drafts
from replayssm_eval.replay.keys import sr_keys
from replayssm_eval.replay.state import write_checkpoint

from tests.helpers.compare import RESIDUAL_FLIP, assert_bits_equal, assert_close, mostly_equal
from tests.helpers.device import TEST_DEVICE
from tests.helpers.delta import (FAMILIES, cut, delta_inputs, one_column_share, phased_start, plain_recurrence,
                                 square_kda_inputs)
from tests.helpers.kernel_checks import one_segment_launches, rounds_own_fold, rounds_to, triton_no_fallback

SMALL = {"gdn": dict(batch=2, heads=2, value_heads=4, dk=20, dv=24), "kda": dict(batch=2, heads=1, value_heads=2, dk=20, dv=12)}
# grouped heads (HV = 2H), K and V not powers of two
AWKWARD = {"gdn": dict(heads=2, value_heads=4, dk=24, dv=40), "kda": dict(heads=1, value_heads=2, dk=24, dv=40)}
FAM = pytest.mark.parametrize("fam", list(FAMILIES))


def cases(per_family):
    """pytest parameters (fam, *case) from {fam: [case, ...]}: the same property, each family's own cases."""
    return [(fam, *(case if isinstance(case, tuple) else (case,))) for fam, cs in per_family.items() for case in cs]


@triton.jit
def _round_tile_kernel(x_ptr, y_ptr, key_ptr, checkpoint_ptr, exch_ptr, count_ptr, HV, K, V, KIND: tl.constexpr,
                       GROUP: tl.constexpr, MAX: tl.constexpr, ORDER: tl.constexpr, RANDOM: tl.constexpr,
                       ROWS: tl.constexpr, COLS: tl.constexpr, AXIS: tl.constexpr, ROT: tl.constexpr,
                       PROGRAMS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    hv = tl.program_id(1)
    ks = tl.arange(0, BK)
    vs = tl.program_id(0) * BV + tl.arange(0, BV)  # one block of BV value columns, as the chunked kernels' grid
    mask = (ks[:, None] < K) & (vs[None, :] < V)
    elem = (hv * V + vs[None, :]).to(tl.int64) * K + ks[:, None]
    x = tl.load(x_ptr + elem, mask=mask, other=0.0)
    y = shared.store_round(x, tl.load(key_ptr), tl.load(checkpoint_ptr), elem, exch_ptr, count_ptr, hv, 1,
                           tl.program_id(0), KIND, GROUP, MAX, ORDER, RANDOM, ROWS, COLS, AXIS, ROT, PROGRAMS, BK, BV)
    tl.store(y_ptr + elem, y, mask=mask)


def round_in_kernel(x, codec, key, checkpoint, bk, bv, programs=1):
    """`store_round` of the states x [1, HV, V, K] in `_round_tile_kernel`, programs of bv value columns (PROGRAMS of
    them exchanging a head scale's amax)."""
    _, hv, v, k = x.shape
    y = torch.empty_like(x)
    exch = torch.empty(hv * 2 * programs, dtype=torch.int32, device=x.device)
    count = torch.zeros(hv, dtype=torch.int32, device=x.device)
    _round_tile_kernel[(triton.cdiv(v, bv), hv, 1)](x, y, key, checkpoint, exch, count, hv, k, v, *codec.args,
                                                     RANDOM=codec.random, ROWS=codec.rows, COLS=codec.cols,
                                                     AXIS=codec.basis[0], ROT=codec.rot, PROGRAMS=programs, BK=bk,
                                                     BV=bv)
    return y.cpu()


@pytest.mark.parametrize("spec", ["fp16", "fp16sr", "bf16", "fp8", "fp8sr", "fp8:scale=head", "fp8e5m2:scale=none",
                                  "nvfp4:scale=row", "nvfp4:scale=head", "int8", "int16sr:scale=head",
                                  "int16:scale=head,order=mul", "int8:scale=block:16", "int8sr:scale=block:32",
                                  "fp8:scale=tile:8x0,max=240", "fp8:scale=tile:32x0,max=240",
                                  "int16:scale=tile:4x16,order=mul", "mxfp8", "mxfp4",
                                  # along head_dim (V), rotated: the whole 24 v columns in the program
                                  "int8sr:axis=headdim,scale=block:16", "fp8:axis=headdim,scale=tile:8x8,order=mul",
                                  "int16:axis=headdim", "mxfp4:axis=headdim", "int8:rot=hadamard:8",
                                  "nvfp4:scale=row,rot=hadamard:8", "int8:axis=headdim,scale=block:8,rot=hadamard:8",
                                  "mx8", "mx8sr", "mx8sr:axis=headdim",
                                  # two-axis scales: column factors over the 24 v columns or the 40 k rows
                                  "int8:scale=rowcol,order=mul", "fp8sr:axis=headdim,scale=rowcol",
                                  # SR with non-default rounds= and bits=
                                  "fp16sr:rounds=7,bits=8", "int8sr:scale=block:16,bits=5", "fp8sr:bits=20",
                                  "mx8sr:bits=32",
                                  # dual-axis factors over the 24 v columns or the 40 k rows (the whole head)
                                  "dualaxis", "dualaxis:axis=dstate,width=3"])
def test_in_kernel_rounding_is_bit_exact(spec, device):
    """`store_round` inside a kernel == write_checkpoint (fmt.quantize with the Philox bits of `replay.keys`)."""
    cfg = ReplayConfig(read=spec, recur=spec, window=4, seed=7)
    x = torch.randn(1, 3, 24, 40) * torch.logspace(-3, 2, 40)  # [B, HV, V, K], rows of mixed magnitude
    x[0, 1, 3] = 0.0
    key = sr_keys(7, 2, torch.tensor([5], device=device), 0)  # [1] int64, loaded in-kernel as the kernels do
    codec = tile_codec(cfg.recur_format, dims=(24, 40))
    y = round_in_kernel(x.to(device), codec, key, torch.tensor([9], device=device), 64, 32)
    want, _ = write_checkpoint(x, cfg, 2, torch.tensor([5]), torch.tensor([9]))  # the torch rounding, on CPU
    assert torch.equal(y, want), f"{spec}: {(y != want).sum().item()} of {y.numel()} elements differ"


@pytest.mark.parametrize("spec, bv", [("nvfp4:scale=row", 64), ("nvfp4:scale=head", 128), ("fp16sr", 64), ("fp8sr", 64),
                                      ("fp8:scale=head", 128), ("fp8:scale=tile:32x0,max=240", 32),
                                      ("int8sr:scale=block:32", 64), ("mxfp4", 64),
                                      ("int8:axis=headdim,scale=block:32,rot=hadamard:32", 32),  # modelopt:int8-hadamard
                                      ("fp8sr:axis=headdim,scale=head,rot=hadamard:64", 128),
                                      ("int8sr:scale=block:32,rot=hadamard:16", 64)]
                         # a head scale over four programs of 32 columns exchanging its amax (compiled code: a GPU)
                         + [pytest.param(spec, -32, marks=pytest.mark.skipif(TEST_DEVICE != "cuda", reason="a GPU"))
                            for spec in ("nvfp4:scale=head", "int16sr:scale=head,order=mul", "fp8:scale=head")])
def test_in_kernel_rounding_bit_exact_k128(spec, bv, device):
    """`store_round` at K = V = 128 with the chunked kernels' tiles (BK = 128 in 8 NVFP4 blocks; 64-wide v-blocks for
    row scales, the whole head for head scales or four 32-wide ones exchanging its amax (bv -32), 32-wide v-blocks
    for SGLang's 32-row tiles and for blocks and rotation runs of 32 along V) == write_checkpoint, bit for bit; a
    NaN and an infinity in the last head's programs."""
    cfg = ReplayConfig(read=spec, recur=spec, window=4, seed=3)
    x = torch.randn(1, 3, 128, 128) * torch.logspace(-2, 1, 128)  # [B, HV, V, K]
    x[0, 1, 70] = 0.0  # a zero row in the second v-block
    x[0, 2, 100, 5], x[0, 2, 40, 9] = float("nan"), float("inf")
    key = sr_keys(3, 1, torch.tensor([2], device=device), 0)
    y = round_in_kernel(x.to(device), tile_codec(cfg.recur_format), key, torch.tensor([5], device=device), 128, abs(bv),
                        programs=4 if bv < 0 else 1)
    want, _ = write_checkpoint(x, cfg, 1, torch.tensor([2]), torch.tensor([5]))  # the torch rounding, on CPU
    assert_bits_equal(y, want)


@FAM
@pytest.mark.parametrize("text", ["fp32/fp32@4", "fp32/fp32@4#closed#skip=0.7", "fp32/fp32@5#spec=3:0.6#closed",
                                  "fp32/fp32@1#closed"])
def test_chunked_triton_fp32(fam, text, device):
    """Per-sequence phases from carried buffers: == decode_reference to FP32 accuracy (window 1: one-row windows)."""
    mod = FAMILIES[fam]
    inputs = delta_inputs(fam, seqlen=13, dtype=torch.float32, device=device, **SMALL[fam])
    start = phased_start(fam, inputs, text, warmup=(0, 3), dtype=torch.float32)
    o_ref, st_ref = mod.decode_reference(*cut(inputs, 0), start, text)
    o, st = mod.chunked(*cut(inputs, 0), start, text, backend="triton")
    assert_close("o", o_ref, o, 1e-5)
    assert_close("S_hi", st_ref.hi, st.hi, 1e-5)
    for name in st_ref.buffer:
        assert_close(f"buffer[{name!r}]", st_ref.buffer[name], st.buffer[name], 1e-5)
    assert torch.equal(st_ref.checkpoint, st.checkpoint)


# K in chunks of 16, the last one part padding, NVFP4 as words; one chunk, the 2nd program's rows part padding, bytes;
# a row a thread; rows summed by their threads, two rows a thread; whole heads whose programs compute their head's
# terms (TERMS: the head terms launch of the folding rows only, or none), rows summed by their threads (one row a
# thread in two warps) or in tiles of words; the NVFP4 read's launch at many sequences (whole heads, one warp)
_KDA_LAUNCHES = [{"BLOCK_V": 16, "BLOCK_K": 16, "WORDS": 1, "TERMS": False, "num_warps": 4},
                 {"BLOCK_V": 32, "BLOCK_K": 32, "WORDS": 0, "TERMS": False, "num_warps": 1},
                 {"BLOCK_V": 32, "BLOCK_K": 16, "WORDS": 2, "TERMS": False, "num_warps": 1},
                 {"BLOCK_V": 64, "BLOCK_K": 32, "WORDS": 2, "TERMS": False, "num_warps": 1},
                 {"BLOCK_V": 64, "BLOCK_K": 16, "WORDS": 2, "TERMS": True, "num_warps": 2},
                 {"BLOCK_V": 64, "BLOCK_K": 16, "WORDS": 1, "TERMS": True, "num_warps": 4},
                 kda_step.step_launch_config(256, 32, 64, 64, NVFP4)]


@pytest.mark.parametrize("text, launch, dk, phased", [
    ("nvfp4:scale=row/fp32@3", 0, 24, False),
    ("nvfp4:scale=head/fp32@3#closed#skip=0.5", 1, 24, True),
    ("nvfp4/fp16sr@4", 0, 128, True),  # whole packed words: 16 a row, the E4M3 block scale of each pair
    ("nvfp4:scale=row/fp32@3", 2, 24, False),  # a row a thread
    ("nvfp4:scale=head/fp32@3#skip=0.5", 2, 40, True),
    ("nvfp4/fp16sr@4", 3, 128, True),  # several rows a thread, whole words
    ("nvfp4:scale=row/fp32@3", 3, 40, False),
    ("nvfp4:scale=tensor/fp32@3", 1, 40, True),
    ("fp8:scale=row/fp32@3#closed", 0, 24, False),
    ("fp16/fp32@3", 1, 24, True),
    ("shared:fp8sr@3#skip=0.8", 0, 24, False),
    ("nvfp4/fp16sr@4", 4, 128, True),  # whole heads with their terms
    ("nvfp4:scale=head/fp32@3#skip=0.5", 4, 40, False),
    ("nvfp4:scale=row/fp32@3#closed", 5, 24, False),
    ("fp16/fp32@3", 5, 40, True),
    ("nvfp4/fp16sr@4", 6, 40, True),
])
def test_kda_step_launches(text, launch, dk, phased, device, monkeypatch):
    """KDA's single-token read kernel with other launches (K in several chunks, part-padding chunks and row blocks) ==
    decode_reference, token by token; phased: from sequences at different phases (folding and reading sequences in
    one launch of the fold kernel, at its own launch; row-scaled NVFP4 and SR read copies do not re-encode exactly:
    they start from the FP32 state)."""
    kda = FAMILIES["kda"]
    monkeypatch.setattr(kda_step, "step_launch_config", lambda *a: _KDA_LAUNCHES[launch])
    cfg = ReplayConfig.parse(text)
    inputs = delta_inputs("kda", batch=2, seqlen=5, dtype=torch.float32, device=device, **{**AWKWARD["kda"], "dk": dk})
    start = phased_start("kda", inputs, cfg, warmup=(0, 1), dtype=torch.float32) if phased else inputs[5]
    o_ref, st_ref = kda.decode_reference(*cut(inputs, 0, 4), start, cfg)
    state, outs = start, []
    for n in range(4):
        o, state = kda.decode_step_triton(*cut(inputs, n, n + 1), state, cfg)
        outs.append(o)
    flips = one_column_share(inputs)  # every case rounds a read copy: the roundings FP32 noise flips
    assert_close("o", o_ref, torch.cat(outs, 1), 1e-5, flips=flips)
    assert_close("buffer u", st_ref.buffer["u"], state.buffer["u"], 1e-5, flips=flips)
    mostly_equal("S_lo", st_ref.lo, state.lo)
    assert torch.equal(st_ref.checkpoint, state.checkpoint) and int(state.checkpoint.min()) >= 1


@pytest.mark.parametrize("text", ["fp32/fp32@4", "fp32/fp32@3#closed"])
def test_kda_square_heads_with_unequal_channel_decays(text, device):
    """K = V (a real KDA model's heads), per-channel decays 40x apart: the chunked Triton kernel and the single-token
    step == decode_reference to FP32 accuracy (FP32 copies: no rounding to flip)."""
    kda = FAMILIES["kda"]
    inputs = square_kda_inputs(seqlen=7, dtype=torch.float32, device=device)
    o_ref, st_ref = kda.decode_reference(*cut(inputs, 0), inputs[5], text)
    o, st = kda.chunked(*cut(inputs, 0), inputs[5], text, backend="triton")
    assert_close("o", o_ref, o, 1e-5)
    assert_close("S_hi", st_ref.hi, st.hi, 1e-5)
    state, outs = inputs[5], []
    for n in range(inputs[0].shape[1]):
        o_n, state = kda.decode_step_triton(*cut(inputs, n, n + 1), state, text)
        outs.append(o_n)
    assert_close("o (step)", o_ref, torch.cat(outs, 1), 1e-5)
    assert_close("S_hi (step)", st_ref.hi, state.hi, 1e-5)


@pytest.mark.parametrize("fam, text", cases({
    "gdn": ["nvfp4:scale=row/fp16sr@4#closed", "shared:nvfp4:scale=head@8", "fp8sr/fp16@4",
            "int16sr:scale=head/int8@4", "int16sr@1", "fp8sr:words=duo/int8sr:words=quad@4"],
    "kda": ["nvfp4:scale=row/fp16sr@4#closed", "shared:nvfp4:scale=tensor@4", "fp8sr/fp16@3#skip=0.6",
            "int8sr/int16:order=mul@3", "vllm:int8", "pimba:mx8sr"],
}))
def test_chunked_triton_quantized(fam, text, device):
    """In-kernel rounding (row and head scales, fp16sr, fp8sr) and torch-rounded copies (a tensor-wide NVFP4 scale):
    == the torch chunked form, up to the roundings FP32 noise flips (`one_column_share` of the outputs); awkward
    sizes (V = 40: two v-blocks, or the whole head for head scales) with one segment per launch; window 1 (`int16sr`,
    `vllm:int8`, `pimba:mx8sr`: a rounding after every token) in one-row windows."""
    mod = FAMILIES[fam]
    inputs = delta_inputs(fam, batch=2, seqlen=10, dtype=torch.float32, device=device, **AWKWARD[fam])
    o_ref, st_ref = mod.chunked(*inputs, text)
    with one_segment_launches():
        o, st = mod.chunked(*inputs, text, backend="triton")
    assert_close("o", o_ref, o, 1e-5, flips=one_column_share(inputs))
    mostly_equal("S_hi", st_ref.hi, st.hi)
    mostly_equal("S_lo", st_ref.lo, st.lo)
    assert torch.equal(st_ref.checkpoint, st.checkpoint)


@FAM
@pytest.mark.parametrize("text, awkward", [
    ("nvfp4:scale=row/fp16sr@4", False),
    # K = 40: blocks of 16 and MX blocks of 32 with a short last one; V = 40: two v-blocks of 32 (tiles of 16 and 32
    # rows, the last one short), the whole head (tiles of 64 rows)
    pytest.param("int8sr:scale=block:16/fp8:scale=tile:16x0,max=240@4", True, marks=pytest.mark.slow),
    ("mxfp4/int16:scale=tile:4x8,order=mul@4", True),
    # along V (the whole head: row scales, blocks of 16 in V = 40) and rotated along K = 40 and V
    ("fp8:axis=headdim,rot=hadamard:8/int8sr:axis=headdim,scale=block:16@4", True),
    pytest.param("nvfp4:axis=headdim,scale=row,rot=hadamard:4/bf16@4", True, marks=pytest.mark.slow),
    pytest.param("fp8sr:scale=tile:32x0,max=240/fp8:scale=tile:64x16@4", True, marks=pytest.mark.slow),
    ("mx8sr/mx8sr:axis=headdim@4", True),  # MX8 blocks of 16 along K = 40 and V = 40, the last ones short
    # two-axis scales: column factors over V = 40 (the whole head in the program) or over K = 40 (axis=headdim)
    ("nvfp4:scale=rowcol/int8sr:axis=headdim,scale=rowcol@4", True),
    # dual-axis factors over V = 40 or K = 40 (the whole head in the program)
    ("dualaxis/dualaxis:axis=dstate,width=8@4", True),
    # SR with non-default rounds= and bits= (stored copies: keyed Philox4x32-10 words, bits= of them)
    ("fp16sr:rounds=7,bits=8/int8sr:scale=block:16,bits=5@4", True),
    ("fp8sr:bits=20/mx8sr:axis=headdim,bits=3@4", False),
    # word layouts along K = 40 (one Philox call per pair, or group of 2, 4, 8 k rows of the program's tile)
    ("fp16sr:words=pair/fp16sr:words=octet,cvt=soft@4", True),
    ("fp16sr:words=duo/fp16sr:words=quad@4", True),
])
def test_chunked_triton_unrounded_folds_round_to_stored(fam, text, awkward, device):
    """rounded=False gives the kernel's FP32 folds; `write_checkpoint` of them is exactly what rounded=True stores
    (both copies rounded in the kernel)."""
    mod = FAMILIES[fam]
    cfg = ReplayConfig.parse(text)
    sizes = {**AWKWARD[fam], "dk": 40} if awkward else SMALL[fam]
    dims = (sizes["dv"], sizes["dk"])
    assert None not in (tile_codec(cfg.recur_format, dims=dims), tile_codec(cfg.read_format, dims=dims))
    inputs = delta_inputs(fam, seqlen=4, dtype=torch.float32, device=device, **sizes)
    _, rounded = mod.RULE.chunk.chunked_triton(mod.RULE.prepare(*inputs, cfg))
    _, fold = mod.RULE.chunk.chunked_triton(mod.RULE.prepare(*inputs, cfg), rounded=False)
    assert rounds_to(fold, rounded, cfg)


@FAM
@pytest.mark.parametrize("text", [
    "int8:ef=fp32/fp16sr:ef=bf16@4",  # each copy its own residual, in FP32 and BF16
    "shared:nvfp4:scale=row,ef=bf16@4#closed",
    "fp16/int8sr:scale=block:8,ef=fp32@4",  # only the recurrence copy keeps one
    "dualaxis:ef=fp32/fp32@4",  # whole-head factors (the FP32 recurrence copy holds the launch's fold)
    "fp32/fp8:axis=headdim,rot=hadamard:8,ef=bf16@4",  # a rotated copy (the FP32 read copy holds the fold)
])
def test_chunked_triton_feedback_rounds_fold_plus_residual(fam, text, device):
    """A copy with error feedback (`ef=`) rounds fold + residual in the kernel and keeps the new residual: one fold's
    copies and residuals are write_checkpoint of the launch's FP32 fold with the call's starting residuals (those of
    the prefill write, not zero), bit for bit; the Triton path runs without falling back to torch. The fold is the
    launch's own where an FP32 copy holds it: on a GPU a whole-head or rotated copy's kernel variant sums its fold in
    another FP32 order than the rounded=False launch (`rounds_own_fold`), which gives the fold of the others."""
    rule = FAMILIES[fam].RULE
    cfg = ReplayConfig.parse(text)
    inputs = delta_inputs(fam, seqlen=4, dtype=torch.float32, device=device, **{**AWKWARD[fam], "dk": 40})
    p = rule.prepare(*inputs, cfg)
    assert shared.feedback_in_kernel(p)
    residual = {copy: t.cpu().clone() for copy, t in p.state.residual.items()}
    assert residual and all(t.abs().max() > 0 for t in residual.values())
    _, unrounded = rule.chunk.chunked_triton(rule.prepare(*inputs, cfg), rounded=False)
    _, rounded = rule.chunk.chunked_triton(p)
    fold = rounded.lo if cfg.read_format.name == "fp32" else rounded.hi if cfg.recur_format.name == "fp32" \
        else unrounded.hi
    hi, lo = write_checkpoint(fold.cpu(), cfg, 0, rounded.seq_ids.cpu(), rounded.checkpoint.cpu(), residual)
    assert_bits_equal(rounded.hi.cpu(), hi)
    assert_bits_equal(rounded.lo.cpu(), lo)
    for copy, want in residual.items():
        assert_bits_equal(rounded.residual[copy].cpu(), want)
    o_ref, st_ref = FAMILIES[fam].chunked(*inputs, cfg)
    o, st = triton_no_fallback(FAMILIES[fam].chunked, *inputs, cfg)
    assert_close("o", o_ref, o, 1e-5, flips=one_column_share(inputs))
    for copy in residual:  # a residual holds its fold's FP32 noise: the noise of the state, not of the residual
        mostly_equal(f"residual[{copy}]", st_ref.residual[copy], st.residual[copy], noise=1e-5 * st_ref.hi.abs().max(),
                     flip_size=RESIDUAL_FLIP)


@FAM
@pytest.mark.parametrize("recur", ["fp8:axis=headdim,rot=hadamard:8", "bf16:rot=hadamard:8",
                                   "int8sr:scale=block:8,rot=hadamard:8"])
def test_rotated_recurrence_copy_rounds_its_own_fold(fam, recur, device):
    """A rotated recurrence copy (runs of 8 along V = 40 or K = 40) is write_checkpoint of the launch's own FP32 fold,
    held by an FP32 read copy beside it, bit for bit. (Rotated read copies: `unrounded_folds` above; a rotated
    recurrence copy's kernel variant folds in another FP32 order than the rounded=False launch on a GPU.)"""
    cfg = ReplayConfig.parse(f"fp32/{recur}@4")
    assert tile_codec(cfg.recur_format) is not None
    inputs = delta_inputs(fam, seqlen=4, dtype=torch.float32, device=device, **{**AWKWARD[fam], "dk": 40})
    rule = FAMILIES[fam].RULE
    _, rounded = rule.chunk.chunked_triton(rule.prepare(*inputs, cfg))
    assert rounds_own_fold(rounded, cfg) and not torch.equal(rounded.hi, rounded.lo)


@FAM
def test_chunked_triton_modelopt_hadamard(fam, device):
    """`modelopt:int8-hadamard` (shared INT8, blocks of 32 along V rotated by H_32 along V) rounded in the kernel at
    V = 64 (two programs of 32 v columns) and K = 24: the outputs and copies are those of the torch chunked form up to
    FP32 flips, and the copy is write_checkpoint of the launch's own FP32 fold bit for bit (`rounds_own_fold`)."""
    mod = FAMILIES[fam]
    cfg = ReplayConfig.parse("modelopt:int8-hadamard")
    assert tile_codec(cfg.recur_format, True, (64, 24)) == cfg.recur_format.kernel_codec
    assert shared.chunked_launch_config(24, 64, cfg.recur_format.kernel_codec.spans(32))["BV"] == 32
    inputs = delta_inputs(fam, batch=2, seqlen=18, dtype=torch.float32, device=device, heads=1, value_heads=2, dk=24,
                          dv=64)
    o_ref, st_ref = mod.chunked(*inputs, cfg)
    o, st = triton_no_fallback(mod.chunked, *inputs, cfg)
    assert_close("o", o_ref, o, 1e-5, flips=one_column_share(inputs))
    mostly_equal("S_hi", st_ref.hi, st.hi)
    assert torch.equal(st_ref.checkpoint, st.checkpoint) and int(st.checkpoint.min()) == 2 and st.lo is st.hi
    own = ReplayConfig.parse(f"fp32/{cfg.recur_format.name}@8")  # one fold, the FP32 read copy holding it
    _, rounded = mod.RULE.chunk.chunked_triton(mod.RULE.prepare(*cut(inputs, 0, 8), *inputs[5:], own))
    assert rounds_own_fold(rounded, own)


@FAM
@pytest.mark.skipif(TEST_DEVICE != "cuda", reason="programs exchange a head's amax only when they run at once (a GPU)")
@pytest.mark.parametrize("text", ["nvfp4/fp16sr@4", "int8:scale=head,order=mul/int8sr:scale=head@4", "shared:nvfp4@4",
                                  "dualaxis/fp16sr@4", "shared:dualaxis:width=8@4"])
def test_head_scale_across_programs(fam, text, device, monkeypatch):
    """A head-scaled copy of a 128-column head held by four programs that exchange its amax (or a dual-axis copy, its
    row sums over V; GDN's in eight programs, `SUMS_BV`): one fold, in a launch of more programs than a GPU holds at once (a head's take their places in
    start order), is exactly write_checkpoint of the launch's FP32 fold (both copies exchanging in the second case);
    over many folds, and one segment per launch, the outputs and copies are those of one program per head up to FP32
    flips (a budget of one flip: three sequences)."""
    rule = FAMILIES[fam].RULE
    cfg = ReplayConfig.parse(text)
    sizes = dict(heads=1, value_heads=2, dk=40, dv=128)
    codecs = [tile_codec(f, True, (128, 40)) for f in (cfg.recur_format, cfg.read_format)]
    assert head_exchange.exchange_programs(codecs, 4, torch.device(device)) == 4
    one = delta_inputs(fam, batch=40, seqlen=4, dtype=torch.float32, device=device, **sizes)  # 320 programs
    _, rounded = rule.chunk.chunked_triton(rule.prepare(*one, cfg))
    _, fold = rule.chunk.chunked_triton(rule.prepare(*one, cfg), rounded=False)
    assert rounds_to(fold, rounded, cfg)
    many = delta_inputs(fam, batch=3, seqlen=37, dtype=torch.float32, device=device, **sizes)
    o, st = rule.chunk.chunked_triton(rule.prepare(*many, cfg))
    with one_segment_launches():
        o_seg, st_seg = rule.chunk.chunked_triton(rule.prepare(*many, cfg))
    monkeypatch.setattr(shared, "exchange_programs", lambda *args: 1)
    o_head, st_head = rule.chunk.chunked_triton(rule.prepare(*many, cfg))
    for out, state in ((o, st), (o_seg, st_seg)):
        assert_close("o", o_head, out, 1e-5, flips=one_column_share(many))
        mostly_equal("S_hi", st_head.hi, state.hi)
        mostly_equal("S_lo", st_head.lo, state.lo)
        assert torch.equal(st_head.checkpoint, state.checkpoint)


@pytest.mark.parametrize("fam", [name if name == "gdn" else pytest.param(name, marks=pytest.mark.slow) for name in FAMILIES])
def test_chunked_triton_engine_word_layouts(fam, device):
    """fp16sr's engine word layouts in the kernel (vLLM's pairs along K, TensorRT-LLM's octets with FlashInfer's software
    conversion) at an odd K, whose pairs end a row unpaired: the stored copies are write_checkpoint of the kernel's
    FP32 folds bit for bit, and the outputs and copies those of the torch chunked form up to FP32 flips."""
    mod = FAMILIES[fam]
    cfg = ReplayConfig.parse("fp16sr:words=pair/fp16sr:words=octet,cvt=soft@4")
    inputs = delta_inputs(fam, batch=2, seqlen=9, dtype=torch.float32, device=device, heads=1, value_heads=2, dk=23,
                          dv=12)
    o_ref, st_ref = mod.chunked(*inputs, cfg)
    o, st = mod.chunked(*inputs, cfg, backend="triton")
    assert_close("o", o_ref, o, 1e-5, flips=one_column_share(inputs))
    mostly_equal("S_hi", st_ref.hi, st.hi)
    mostly_equal("S_lo", st_ref.lo, st.lo)
    first = (*cut(inputs, 0, 4), *inputs[5:])  # one fold: the unrounded launch's fold is the rounded launch's
    _, rounded = mod.RULE.chunk.chunked_triton(mod.RULE.prepare(*first, cfg))
    _, fold = mod.RULE.chunk.chunked_triton(mod.RULE.prepare(*first, cfg), rounded=False)
    assert rounds_to(fold, rounded, cfg)


@FAM
def test_chunked_triton_refuses_fp64(fam, device):
    inputs = delta_inputs(fam, seqlen=3, dtype=torch.float32, device=device, **SMALL[fam])
    with pytest.raises(ValueError, match="backend='triton' computes in FP32"):
        FAMILIES[fam].chunked(*inputs, "fp32", backend="triton", compute_dtype=torch.float64)


@pytest.mark.parametrize("fam, text, exact, phased", cases({
    "gdn": [("fp32/fp32@3#closed", True, False), ("nvfp4/fp16sr@4", False, False), ("shared:fp8sr@3#skip=0.8", False, False)],
    "kda": [("fp32/fp32@3#closed", True, True), ("fp32/fp32@3#skip=0.7", True, True), ("nvfp4/fp16sr@4", False, True),
            ("nvfp4:scale=row/fp32@3#closed", True, False), ("shared:fp8sr@3#skip=0.8", False, False),
            ("fp8/fp32@4#spec=2:0.6", True, False), ("fp32/fp32@3#closed#buf=bf16", True, True),
            ("int16:scale=head/fp32@3", True, False)],
}))
def test_decode_step_triton(fam, text, exact, phased, device):
    """Token by token through the single-token kernel (packed read copy on non-flush steps) == decode_reference,
    awkward sizes; phased: sequences at different phases (folding and reading sequences in one launch) from a state
    whose read copy re-encodes exactly (row-scaled NVFP4 and SR copies do not: they start from the FP32 state)."""
    mod = FAMILIES[fam]
    cfg = ReplayConfig.parse(text)
    inputs = delta_inputs(fam, batch=2, seqlen=7, dtype=torch.float32, device=device, **AWKWARD[fam])
    start = phased_start(fam, inputs, cfg, warmup=(0, 1), dtype=torch.float32) if phased else inputs[5]
    o_ref, st_ref = mod.decode_reference(*cut(inputs, 0, 5), start, cfg)
    state, outs = start, []
    for n in range(5):
        o, state = mod.decode_step_triton(*cut(inputs, n, n + 1), state, cfg)
        outs.append(o)
    flips = 0.0 if exact else one_column_share(inputs)  # quantized copies: the roundings FP32 noise flips
    assert_close("o", o_ref, torch.cat(outs, 1), 1e-5, flips=flips)
    if exact:
        assert_close("S_hi", st_ref.hi, state.hi, 1e-5)
    else:
        mostly_equal("S_hi", st_ref.hi, state.hi)
        mostly_equal("S_lo", st_ref.lo, state.lo)
    assert torch.equal(st_ref.checkpoint, state.checkpoint) and int(state.checkpoint.min()) >= 1
    assert_close("buffer u", st_ref.buffer["u"], state.buffer["u"], 1e-5, flips=flips)
    fmt = shared_step.read_copy_format(cfg)
    assert torch.equal(fmt.decode(state.lo_packed), state.lo), "lo_packed must decode to the stored read copy"


@pytest.mark.parametrize("fam, text, launch", cases({
    "gdn": [("fp32/fp32@16", None), ("shared:fp32@16#buf=bf16", None),
            ("shared:fp32@16", {"BLOCK_V": 16, "BLOCK_K": 16, "TILES": 2, "num_warps": 4})],
    "kda": [("fp32/fp32@16", None)]}))
def test_decode_step_full_window(fam, text, launch, device, monkeypatch):
    """A whole window of 16 entries through the single-token kernels (GDN's open fold then adds its buffered rows as
    one product, below 16 as rank-1 updates, from an FP32 read copy column by column: `fold_columns`, in two passes
    of 16 at launch; KDA's always as one product, by columns), from sequences at different phases so a launch has
    folding and reading rows: == decode_reference to FP32 accuracy over 18 tokens (FP32 copies)."""
    mod = FAMILIES[fam]
    if launch is not None:
        monkeypatch.setattr(gdn_step, "step_launch_config", lambda *a: launch)
    cfg = ReplayConfig.parse(text)
    inputs = delta_inputs(fam, batch=2, seqlen=19, dtype=torch.float32, device=device, **AWKWARD[fam])
    start = phased_start(fam, inputs, cfg, warmup=(0, 3), dtype=torch.float32)
    o_ref, st_ref = mod.decode_reference(*cut(inputs, 0, 18), start, cfg)
    state, outs = start, []
    for n in range(18):
        o, state = mod.decode_step_triton(*cut(inputs, n, n + 1), state, cfg)
        outs.append(o)
    assert_close("o", o_ref, torch.cat(outs, 1), 1e-5)
    assert_close("S_hi", st_ref.hi, state.hi, 1e-5)
    assert torch.equal(st_ref.checkpoint, state.checkpoint) and int(state.checkpoint.min()) >= 1


@pytest.mark.parametrize("dk, block_v, block_k, stages", [
    pytest.param(24, 16, 16, 2, marks=pytest.mark.slow), pytest.param(24, 16, 16, 3, marks=pytest.mark.slow),
    pytest.param(128, 64, 32, 3, marks=pytest.mark.slow)])  # 13 s in the interpreter: the full suite
def test_kda_open_fold_stages_keep_the_bits(dk, block_v, block_k, stages, device, monkeypatch):
    """KDA's open fold with its column passes pipelined (STAGES > 1: the next columns loaded while one folds) == the
    same fold one pass at a time, bit for bit (outputs, S_hi, the buffer), over 18 tokens of a 16-entry window from
    sequences at different phases: K = 24 in two passes of 16 columns, and K = 128 in four of 32 (the default's
    rows per program). The interpreter runs the passes in order whatever STAGES says; on a GPU
    (`REPLAYSSM_TEST_DEVICE=cuda`) the pipelined kernel is a different compiled program."""
    kda = FAMILIES["kda"]
    cfg = ReplayConfig.parse("fp32/fp32@16")
    inputs = delta_inputs("kda", batch=3, seqlen=18, dtype=torch.float32, device=device, **{**AWKWARD["kda"], "dk": dk})
    start = phased_start("kda", inputs, cfg, warmup=(0, 5, 2), dtype=torch.float32)
    runs = []
    for n_stages in (1, stages):
        launch = {"BLOCK_V": block_v, "BLOCK_K": block_k, "STAGES": n_stages, "num_warps": 4}
        monkeypatch.setattr(kda_step, "fold_launch_config", lambda *a, launch=launch: launch)
        state, outs = start, []
        for n in range(18):
            o, state = kda.decode_step_triton(*cut(inputs, n, n + 1), state, cfg)
            outs.append(o)
        runs.append((torch.cat(outs, 1), state))
    (o_one, st_one), (o_staged, st_staged) = runs
    assert torch.equal(st_one.checkpoint, st_staged.checkpoint) and int(st_one.checkpoint.min()) >= 1
    assert_bits_equal(o_one, o_staged)
    assert_bits_equal(st_one.hi, st_staged.hi)
    assert_bits_equal(st_one.buffer["u"], st_staged.buffer["u"])


@FAM
def test_verify_triton(fam, device):
    """Speculative verification kernel == the reference's output-only verification, per sequence."""
    mod = FAMILIES[fam]
    cfg = ReplayConfig.parse("nvfp4/fp32@8#spec=4:0.5#skip=0.6")
    inputs = delta_inputs(fam, seqlen=7, dtype=torch.float32, device=device, **SMALL[fam])
    st = inputs[5]
    for n in range(3):  # committed entries and a packed read copy, from the step kernel
        _, st = mod.decode_step_triton(*cut(inputs, n, n + 1), st, cfg)
    drafts = dict(zip(("q", "k", "v", "g", "beta"), cut(inputs, 3, 7)))
    width = torch.tensor([4, 3], device=device)
    read_hi = torch.tensor([False, True], device=device)
    u, o = mod.RULE.step.verify_triton(st.hi, st.lo_packed, cfg.read_format, st.buffer, st.schedule.count, drafts,
                                          width, read_hi, groups=2, eps=0.6)
    for b in range(2):
        ring = {name: t[b].clone() for name, t in st.buffer.items()}
        h, w = int(st.schedule.count[b]), int(width[b])
        ring["k"][h:h + w] = drafts["k"][b, :w]
        ring["g"][h:h + w] = drafts["g"][b, :w]
        src = (st.hi if read_hi[b] else st.lo)[b].transpose(-1, -2)
        q = drafts["q"][b, :w].repeat_interleave(2, 1)
        u_ref, o_ref = verify_drafts(src, ring, h, w, q, drafts["v"][b, :w], drafts["beta"][b, :w], 2, 0.6)
        assert_close(f"u[{b}]", u_ref, u[b, :w], 1e-5)
        assert_close(f"o[{b}]", o_ref, o[b, :w], 1e-5)


@FAM
def test_conventional_step(fam, device):
    """The fused FP32 eager step == the plain recurrence, token by token, state updated in place."""
    inputs = delta_inputs(fam, batch=2, seqlen=3, dtype=torch.float32, device=device, **AWKWARD[fam])
    want, want_state = plain_recurrence(inputs)
    state = to_format_layout(inputs[5]).contiguous()
    outs = []
    for n in range(3):
        q, k, v, g, beta = (t[:, n].contiguous() for t in inputs[:5])
        outs.append(FAMILIES[fam].FAMILY.conventional_step(q, k, v, g, beta, state))
    assert_close("o", want, torch.stack(outs, 1), 1e-5)
    assert_close("state", want_state, state.transpose(-1, -2), 1e-5)


@FAM
def test_verify_family_convention(fam, device):
    """`verify` (KernelFamily convention) from a state at a step boundary, every draft accepted: the drafts' outputs
    are the committed outputs of decode_reference."""
    mod = FAMILIES[fam]
    cfg = "nvfp4/fp32@8#spec=4:1"
    inputs = delta_inputs(fam, seqlen=8, dtype=torch.float32, device=device, **SMALL[fam])
    o_ref, _ = mod.decode_reference(*inputs, cfg)
    state = inputs[5]
    for n in range(4):
        _, state = mod.decode_step_triton(*cut(inputs, n, n + 1), state, cfg)
    assert state.schedule.step_left.tolist() == [0, 0] and state.schedule.count.tolist() == [4, 4]
    o = mod.verify(*cut(inputs, 4, 8), state, cfg)
    assert_close("o", o_ref[:, 4:8], o, 1e-5)

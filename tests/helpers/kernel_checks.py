"""Checks of the Triton kernels: no torch fallback, one segment per launch, in-kernel rounding."""

import warnings
from unittest import mock

import torch
import triton
import triton.language as tl

from replayssm_eval.formats import device
from replayssm_eval.formats.codec import KernelCodec
from replayssm_eval.kernels.delta import triton_chunk
from replayssm_eval.replay.state import write_checkpoint


def one_segment_launches():
    """Every `_chunked_kernel` launch runs one segment (SEGS=1), the launch of copies that torch rounds. On a GPU a
    different SEGS is a different compiled kernel, whose FP32 folds (tf32x3 dots) may differ in the last bit."""
    return mock.patch.object(triton_chunk, "BLOCK_ELEMENTS", 1)


def rounds_to(fold, rounded, cfg) -> bool:
    """The stored copies of `rounded` are exactly write_checkpoint of the FP32 folds in `fold` (by the torch rounding on
    CPU: on CUDA write_checkpoint would run the Triton encoder)."""
    hi, lo = write_checkpoint(fold.hi.cpu(), cfg, 0, rounded.seq_ids.cpu(), rounded.checkpoint.cpu())
    return torch.equal(hi, rounded.hi.cpu()) and torch.equal(lo, rounded.lo.cpu())


def rounds_own_fold(rounded, cfg) -> bool:
    """cfg's read copy is FP32, i.e. the launch's own fold: its recurrence copy in `rounded` is exactly write_checkpoint
    of it. On a GPU, unlike `rounds_to`, this holds where the recurrence copy is rotated: such a kernel variant sums
    its FP32 fold in another order than the rounded=False launch (the H200 run of benchmarks/gpu_check_rotation.py's
    cases in the chunked kernels)."""
    hi, _ = write_checkpoint(rounded.lo.cpu(), cfg, 0, rounded.seq_ids.cpu(), rounded.checkpoint.cpu())
    return torch.equal(hi, rounded.hi.cpu())


def triton_no_fallback(chunked, *args):
    """chunked(*args, backend="triton"), failing on any UserWarning (such as a torch fallback's): the kernel ran."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = chunked(*args, backend="triton")
    warned = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert not warned, f"this config must run the kernel: {warned}"
    return out


@triton.jit
def _round_tile_kernel(x_ptr, y_ptr, key_ptr, ck_ptr, R, C, KIND: tl.constexpr, GROUP: tl.constexpr,
                       MAX: tl.constexpr, ORDER: tl.constexpr, RANDOM: tl.constexpr, ROWS: tl.constexpr,
                       COLS: tl.constexpr, AXIS: tl.constexpr, ROT: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_C: tl.constexpr):
    # x, y: [B, R, C], one program = one state b held whole (a head: R = P rows of C = N), as a chunked kernel's tile
    b = tl.program_id(0)
    rows, cols = tl.arange(0, BLOCK_R), tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    elem = rows[:, None].to(tl.int64) * C + cols[None, :]  # [BLOCK_R, BLOCK_C] index in [R, C]
    x = tl.load(x_ptr + b * R * C + elem, mask=mask, other=0.0)
    bits = device.state_bits(tl.load(key_ptr + b), (tl.load(ck_ptr + b) << 32) + elem, cols[None, :], KIND, RANDOM)
    y = device.round_state_tile(x, bits, KIND, GROUP, MAX, ORDER, ROWS, COLS, AXIS, ROT, BLOCK_R, BLOCK_C)
    tl.store(y_ptr + b * R * C + elem, y, mask=mask)


def round_tile_in_kernel(x: torch.Tensor, codec: KernelCodec, keys: torch.Tensor, checkpoint: torch.Tensor):
    """`device.round_state_tile` of states x [B, 1, P, N] (one head each) in a kernel program that holds a whole state,
    oriented as the codec's axis, its Philox words from `device.state_bits` with keys and checkpoint ([B] int64,
    `replay.keys`); the result is on x's device."""
    b, _, p, n = x.shape
    y = torch.empty_like(x)
    axis, rot = codec.basis
    block_p, block_n = triton.next_power_of_2(p), triton.next_power_of_2(n)
    if axis:  # MX and NVFP4 blocks along head_dim: at least one block (quantize_tile)
        block_p = max(block_p, codec.block)
    else:
        block_n = max(block_n, codec.block)
    _round_tile_kernel[(b,)](x, y, keys.to(x.device), checkpoint.to(x.device), p, n, *codec.args,
                             RANDOM=codec.random, ROWS=codec.rows, COLS=codec.cols, AXIS=axis, ROT=rot,
                             BLOCK_R=block_p, BLOCK_C=block_n)
    return y

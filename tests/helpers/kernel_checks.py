"""Checks of the Triton kernels: no torch fallback, one segment per launch, in-kernel rounding."""

import warnings
from unittest import mock

import torch

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


def triton_no_fallback(chunked, *args):
    """chunked(*args, backend="triton"), failing on any UserWarning (such as a torch fallback's): the kernel ran."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = chunked(*args, backend="triton")
    warned = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert not warned, f"this config must run the kernel: {warned}"
    return out

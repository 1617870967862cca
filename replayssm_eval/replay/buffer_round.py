"""The buffer dtype (`#buf=`) inside Triton kernels: `round_buffered` rounds as `ReplayConfig.round_buffered` does.

`buffer_kind(config)` is the constexpr a kernel takes: BUF_FP32 keeps FP32 (kernels keep their FP32 code path,
unchanged), BUF_BF16 / BUF_FP16 round to BF16 / FP16, round to nearest even, and back to FP32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm_eval.formats.device import round_bf16, round_fp16
from replayssm_eval.replay.config import BUFFER_DTYPES, ReplayConfig

# globals read in @triton.jit are constexpr
BUF_FP32, BUF_BF16, BUF_FP16 = (tl.constexpr(BUFFER_DTYPES.index(name)) for name in ("fp32", "bf16", "fp16"))


def buffer_kind(config: ReplayConfig) -> int:
    """The constexpr of `config.buffer_dtype` for `round_buffered`."""
    return BUFFER_DTYPES.index(config.buffer_dtype)


@triton.jit
def round_buffered(x, BUF: tl.constexpr):
    """x (FP32) rounded to the buffer dtype and back (exact integer rounding: the interpreter and the GPU agree with
    torch bit for bit); x itself for BUF = 0."""
    y = x
    if BUF == BUF_BF16:
        y = round_bf16(x)
    elif BUF == BUF_FP16:
        y = round_fp16(x)
    return y

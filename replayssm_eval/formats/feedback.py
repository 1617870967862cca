"""`ef=fp32|bf16`: error feedback on any format (`int8:scale=row,ef=fp32`).

A stored copy in a format with error feedback keeps, beside its codes, the residual e of its last
rounding in the stated precision, and adds it to the state before the next rounding of the same copy:

    y = S + e;   stored = decode(encode(y));   e = precision(y - stored)      (e = 0 before the first rounding)

all in FP32, `precision` rounding to nearest even (bf16) or keeping FP32. The format itself rounds as its
inner format; the residual lives with the stored state (`replay.state`), which applies the rule above at
every checkpoint write (the chunked kernels in their loop: `kernel_codec`'s `ef`). The residual counts in
the bytes of a state (2 or 4 per element).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from replayssm_eval.formats import layout
from replayssm_eval.formats.codec import KernelCodec, Residual
from replayssm_eval.formats.formats import StateFormat, WrappedFormat

FEEDBACK = ("none", "fp32", "bf16")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Feedback(WrappedFormat):
    """`inner` with its rounding residual kept in `precision` (`fp32` or `bf16`) and fed into its next rounding."""

    inner: StateFormat
    precision: str

    def __post_init__(self) -> None:
        if self.precision not in _DTYPES:
            raise ValueError(f"bad value '{self.precision}' for option 'ef' of state format '{self.inner.base}'; "
                             f"accepted: {', '.join(FEEDBACK)}")

    @property
    def option(self) -> str:
        return f"ef={self.precision}"

    @property
    def feedback(self) -> str:
        return self.precision

    @property
    def bits_per_element(self) -> float:
        return self.inner.bits_per_element + 8.0 * _DTYPES[self.precision].itemsize

    @property
    def kernel_codec(self) -> KernelCodec | None:
        """The inner format's codec with the residual's precision (`Residual`), None where the inner has none."""
        codec = self.inner.kernel_codec
        return None if codec is None else replace(codec, ef=Residual[self.precision.upper()])

    def storage_bytes(self, shape) -> int:
        return self.inner.storage_bytes(shape) + layout.prod(shape) * _DTYPES[self.precision].itemsize

    def residual(self, target: torch.Tensor, stored: torch.Tensor) -> torch.Tensor:
        """The residual `target - stored` of one rounding (FP32 tensors), in the feedback precision (as FP32)."""
        return (target - stored).to(_DTYPES[self.precision]).float()

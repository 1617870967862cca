"""`PackedState`: the bytes a kernel reads for one quantized state tensor."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedState:
    """One encoded state tensor; the layout of each field is given by the format's docstring.

    format        canonical spec string of the format that wrote it (`StateFormat.name`)
    shape         shape of the tensor that was encoded (decode returns this shape)
    data          element codes (uint8; int8 / int16 for the integer formats), or the elements themselves for fp32 / bf16 / fp16
    scales        per-block scales (uint8: E4M3 for nvfp4, E8M0 for mx; FP32 for fp8/int block:N and tile:RxC), else None
    global_scale  FP32 decode scales (nvfp4 S_dec, fp8/int amax/max; the row factors of scale=rowcol), else None
    col_scale     FP32 column factors of scale=rowcol `[..., H, C]`, else None
    """

    FIELDS = ("data", "scales", "global_scale", "col_scale")  # the tensor fields, each leading with the state's dims

    format: str
    shape: tuple[int, ...]
    data: torch.Tensor
    scales: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None
    col_scale: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors() if t is not None)

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """The tensor fields in `FIELDS` order."""
        return tuple(getattr(self, name) for name in self.FIELDS)

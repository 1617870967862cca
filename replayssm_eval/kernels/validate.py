"""Argument checks shared by the kernel families: errors name the argument and what was expected."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def check_tensor(name: str, value, shape: tuple, *, device: torch.device | None = None, dtypes=FLOAT_DTYPES) -> None:
    """Raise ValueError unless `value` is a tensor of `shape` (None entries match any size), dtype and device."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != len(shape) or any(want is not None and got != want for got, want in zip(value.shape, shape)):
        expected = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} has shape {list(value.shape)}, expected {expected}")
    if value.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {value.dtype}, expected one of {', '.join(map(str, dtypes))}")
    if device is not None and value.device != device:
        raise ValueError(f"{name} is on {value.device}, expected {device} (the device of the other inputs)")

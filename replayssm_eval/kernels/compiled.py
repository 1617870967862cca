"""Whether a device runs the kernels compiled: what GPU-only launch features (programs that wait on each other,
dependent launches) ask before they are used."""

from __future__ import annotations

import os

import torch


def compiled_on_gpu(device: torch.device) -> bool:
    """Whether Triton launches on `device` run compiled code on a GPU: a CUDA device, not Triton's interpreter
    (TRITON_INTERPRET=1), which runs programs one after another and no PTX."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"

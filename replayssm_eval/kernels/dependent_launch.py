"""Programmatic dependent launch (PDL, sm_90 and later) between the launches of one decode step.

A launch made with `launch_pdl=True` may start its programs while the launch before it in the stream is still running:
they wait (`wait_for_prior_launch`, `griddepcontrol.wait`) until that launch has completed and its writes are visible,
so the launch latency and the first launch's tail overlap. A first launch lets the next one start once all of its
programs have begun (`release_dependents`). Each waits before its first load or store: the bits are those of two
launches in stream order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from replayssm_eval.kernels.compiled import compiled_on_gpu


def dependent_launches(device: torch.device) -> bool:
    """Whether launches on `device` may overlap by PDL: compiled code on a GPU of compute capability 9.0 or later (the
    interpreter runs no PTX, and `griddepcontrol` is an sm_90 instruction)."""
    return compiled_on_gpu(device) and torch.cuda.get_device_capability(device) >= (9, 0)


@triton.jit
def wait_for_prior_launch(PDL: tl.constexpr):
    """With PDL, wait until the launch before this one has completed and its writes are visible."""
    if PDL:
        gdc_wait()


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """With PDL, let the next launch start its programs once every program of this one has passed here."""
    if PDL:
        gdc_launch_dependents()

"""Which SSM layer is running right now, and the rebinding of a family's scan functions.

The scan functions are module globals shared by every layer (and every model) of a family and
take no layer index. A forward pre-hook on each routed mixer records the running layer in a
context variable (its index, module, session and padding mask); the post-hook clears it and
checks that the layer really went through a replacement. A replacement called with no active
layer (a model of the same family that nobody routed, e.g. the unmodified reference in a test)
runs the function it replaced, so rebinding is harmless to other models in the process.
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from replayssm_eval.kernels.family import KernelFamily

_ACTIVE: contextvars.ContextVar[ActiveLayer | None] = contextvars.ContextVar("replayssm_active_layer", default=None)
_ORIGINALS: dict[tuple[str, str], Callable] = {}


@dataclass
class ActiveLayer:
    """The SSM layer whose mixer forward is running.

    family: the kernel family that runs the mixer's scans.
    session: the ReplaySession of the cache passed to the mixer; None for a forward without cache.
    attention_mask: [B, T] padding mask the mixer received (None when the batch has no padding).
    routed: set by a replacement scan function, checked when the mixer returns.
    """

    layer_idx: int
    mixer: nn.Module
    family: KernelFamily
    session: object | None
    attention_mask: torch.Tensor | None
    routed: bool = False


def active() -> ActiveLayer | None:
    return _ACTIVE.get()


def enter(layer: ActiveLayer) -> contextvars.Token:
    return _ACTIVE.set(layer)


def leave(token: contextvars.Token) -> ActiveLayer:
    layer = _ACTIVE.get()
    _ACTIVE.reset(token)
    return layer


def dispatch(original: Callable, prefill: Callable, args: tuple, opts: dict, has_state: bool,
             resume: Callable[[ActiveLayer], object]):
    """The path of a hooked chunk scan: HF's own function outside a routed model, the FP32 prefill when
    there is no carried state yet (the prompt, or a cache without a session), else `resume(layer)`."""
    layer = active()
    if layer is None:
        return original(*args, **opts)
    layer.routed = True
    if not has_state or layer.session is None:
        if layer.session is not None:
            layer.session.forget(layer.layer_idx)
        return prefill(*args, **opts)
    return resume(layer)


def rebind(module_name: str, function_name: str, make: Callable[[Callable, Callable], Callable]) -> None:
    """Replace `module_name.function_name` by `make(original, torch_reference)`, once per process.

    original: what the module bound (an hub or fla / mamba_ssm kernel when one is installed);
    torch_reference: the plain torch function under transformers' kernel-selection wrapper.
    """
    if (module_name, function_name) in _ORIGINALS:
        return
    module = importlib.import_module(module_name)
    original = getattr(module, function_name, None)
    if original is None:
        import transformers

        raise ValueError(
            f"{module_name} has no {function_name} in transformers {transformers.__version__}; "
            "the hook point moved, so this version cannot be routed"
        )
    _ORIGINALS[(module_name, function_name)] = original
    setattr(module, function_name, make(original, inspect.unwrap(original)))

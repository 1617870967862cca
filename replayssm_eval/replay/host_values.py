"""What the host knows about a device tensor without reading it back.

A read of a device value on the host (`.tolist()`, `int(t.max())`, `torch.equal`) waits for every queued kernel;
once per layer and call it keeps the host from queueing the next layers while the GPU runs. Values the host
computed itself (a schedule's counts, a batch's Philox keys) are remembered per tensor instead: by identity, while
the tensor lives and is not written in place (its version counter), so a replaced or modified tensor is never
taken for the one remembered. Torch counts only its own writes: a tensor that a Triton kernel or a CUDA graph's
replay writes in place must not be remembered (the fixed-buffer step keeps its own clones of the counts).
"""

from __future__ import annotations

import weakref

import torch

# id(tensor) -> (a weak reference to it, its version counter, what is remembered of it)
_REMEMBERED: dict[int, tuple[weakref.ref, int, dict]] = {}


def remembered(t: torch.Tensor) -> dict:
    """The dict of what is remembered about `t`: empty for a tensor not seen before, or written in place since."""
    ref, version, values = _REMEMBERED.get(id(t), (None, None, None))
    if ref is None or ref() is not t or version != t._version:
        for stale in [k for k, (r, _, _) in _REMEMBERED.items() if r() is None]:
            del _REMEMBERED[stale]
        values = {}
        _REMEMBERED[id(t)] = (weakref.ref(t), t._version, values)
    return values


def remember_host(t: torch.Tensor, values: list) -> None:
    """Remember `values`, the host's own copy of `t`'s elements (`t.tolist()`), unless a CUDA graph is capturing
    (a captured tensor holds its values only when the graph replays)."""
    if not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
        remembered(t)["host"] = values


def remember_nonpositive(t: torch.Tensor) -> None:
    """Remember that no element of `t` exceeds 0 as its producer guarantees it (a model gate's log-decays,
    -exp(A) softplus(.)): a check of it then needs no device read (`known_nonpositive`)."""
    remembered(t)["nonpositive"] = True


def known_nonpositive(t: torch.Tensor) -> bool:
    """Whether `remember_nonpositive` vouched for `t` (and it was not written in place since)."""
    return remembered(t).get("nonpositive", False)


def host_copy(t: torch.Tensor) -> list | None:
    """`t.tolist()` where the host remembers it (`remember_host`), else None (the caller reads the device)."""
    return remembered(t).get("host")


def to_host(t: torch.Tensor) -> list:
    """`t.tolist()`, without a device read where the host remembers it."""
    values = host_copy(t)
    return t.tolist() if values is None else values


def largest(t: torch.Tensor) -> int:
    """The largest element of an integer tensor [B] (0 when empty), without a device read where the host knows it."""
    return max(to_host(t), default=0)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`torch.equal(a, b)`, without a device read where a and b are the same tensor."""
    return a is b or torch.equal(a, b)

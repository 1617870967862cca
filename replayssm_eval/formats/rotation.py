"""`rot=hadamard:N`: any format read in an orthonormal Hadamard basis (`int8:rot=hadamard:32`).

The state is rotated by H_N = S_N / sqrt(N) (S_N the Sylvester +-1 matrix, H_N H_N^T = I) on each run
of N consecutive elements along the format's block axis (d_state, or head_dim with `axis=headdim`;
N a power of two dividing that dim), the inner format encodes the rotated state, and decode rotates
back, so the decoded copy is in the original basis. Both directions are computed in FP64 and rounded
to FP32 once. It is not exact in FP32: the round trip of an unquantized state is x up to one FP32
rounding per direction (relative error within a few 2^-24 of the block's norm), never bit for bit,
for every N > 1 (even N = 4^k, where 1/sqrt(N) = 2^-k is exact, each output is a rounded sum of N terms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replayssm_eval.formats import layout
from replayssm_eval.formats.formats import StateFormat, WrappedFormat
from replayssm_eval.formats.packed import PackedState

ROTATIONS = ("none", "hadamard:N")


def hadamard(n: int, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> torch.Tensor:
    """Orthonormal Hadamard matrix [n, n] (Sylvester order, entries +-1/sqrt(n)); n a power of two.

    Built on `device` with no host-to-device copy, so it can be made inside a CUDA graph capture.
    """
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two; got {n}")
    s = torch.ones(1, 1, dtype=torch.float64, device=device)
    while s.shape[0] < n:
        s = torch.cat((torch.cat((s, s), 1), torch.cat((s, -s), 1)), 0)
    return (s * (1 / math.sqrt(n))).to(dtype)  # +-1 times the correctly rounded 1/sqrt(n): exact on any device


@dataclass(frozen=True)
class Rotated(WrappedFormat):
    """`inner` applied to the state rotated by H_`size` along inner's block axis; packed as inner packs it."""

    inner: StateFormat
    size: int

    def __post_init__(self) -> None:
        if self.size < 1 or self.size & (self.size - 1):
            raise ValueError(f"bad value 'hadamard:{self.size}' for option 'rot' of state format '{self.inner.base}'; "
                             "accepted: hadamard:N with N a power of two")

    @property
    def option(self) -> str:
        return f"rot=hadamard:{self.size}"

    def rotate(self, x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """x `[..., H, P, N]` times H (or H^T) on runs of `size` along the axis, in FP64, rounded to FP32."""
        xo = layout.orient(layout.as_bhpn(x).double(), self.axis)  # [B, H, R, C]
        c = xo.shape[-1]
        if c % self.size:
            raise ValueError(f"rot=hadamard:{self.size} needs the {self.axis} dim ({c}) to be a multiple of {self.size}")
        h = hadamard(self.size, device=x.device)
        y = xo.unflatten(-1, (-1, self.size)) @ (h if inverse else h.T)  # [B, H, R, C/size, size]
        return layout.unorient(y.flatten(-2).float(), self.axis).reshape(x.shape)

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        return super().encode(self.rotate(x), seed=seed, offset=offset, random_bits=random_bits)

    def decode(self, packed) -> torch.Tensor:
        return self.rotate(super().decode(packed), inverse=True)

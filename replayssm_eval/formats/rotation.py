"""`rot=hadamard:N`: any format read in an orthonormal Hadamard basis (`int8:rot=hadamard:32`).

The state is rotated by H_N = S_N / sqrt(N) (S_N the Sylvester +-1 matrix, H_N H_N^T = I) on each run
of N consecutive elements along the format's block axis (d_state, or head_dim with `axis=headdim`;
N a power of two dividing that dim), the inner format encodes the rotated state, and decode rotates
back, so the decoded copy is in the original basis. Both directions are computed in FP64 and rounded
to FP32 once, in one defined order (`hadamard_runs`: log2(N) butterfly stages, then the scale), the
order the Triton kernels compute too (`device.hadamard_tile`: the same bits in the interpreter and on a
GPU). It is not exact in FP32: the round trip of an unquantized state is x up to one FP32
rounding per direction (relative error within a few 2^-24 of the block's norm), never bit for bit,
for every N > 1 (even N = 4^k, where 1/sqrt(N) = 2^-k is exact, each output is a rounded sum of N terms).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from replayssm_eval.formats import layout
from replayssm_eval.formats.codec import KernelCodec
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


def hadamard_runs(x: torch.Tensor, size: int) -> torch.Tensor:
    """x `[..., C]` (FP64, C a multiple of size) times H_size on each run of `size` along C, in FP64: stages h = 1, 2,
    ..., size / 2 each map the pairs (a, b) = (x[j], x[j + h]) of every block of 2h to (a + b, a - b) (Sylvester
    order), then one product by fp64(1 / sqrt(size)) (`hadamard`'s entries). H_size is symmetric: the same call
    rotates back."""
    y = x.unflatten(-1, (-1, size))  # [..., C / size, size]
    h = 1
    while h < size:
        pairs = y.unflatten(-1, (size // (2 * h), 2, h))  # [..., C / size, size / 2h, 2, h]
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).flatten(-3)
        h *= 2
    return (y * (1 / math.sqrt(size))).flatten(-2)


def rotate_runs(xo: torch.Tensor, size: int, axis: str) -> torch.Tensor:
    """The oriented xo `[B, H, R, C]` (C along `axis`, a multiple of size) times H_size on runs of `size` along C, in
    FP64 (`hadamard_runs`), rounded to FP32."""
    c = xo.shape[-1]
    if c % size:
        raise ValueError(f"rot=hadamard:{size} needs the {axis} dim ({c}) to be a multiple of {size}")
    return hadamard_runs(xo.double(), size).float()


def rotate_state(x: torch.Tensor, size: int, axis: str) -> torch.Tensor:
    """A state x `[..., H, P, N]` times H_size on runs of `size` along `axis` (`rotate_runs`), FP32 in x's shape. H_size
    is symmetric: the same call rotates back."""
    xo = layout.orient(layout.as_bhpn(x), axis)  # [B, H, R, C]
    return layout.unorient(rotate_runs(xo, size, axis), axis).reshape(x.shape)


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

    @property
    def kernel_codec(self) -> KernelCodec | None:
        """inner's codec with the rotation (`KernelCodec.rot`), None where inner has none."""
        codec = self.inner.kernel_codec
        return None if codec is None else dataclasses.replace(codec, rot=self.size)

    def rotate(self, x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """x `[..., H, P, N]` times H (inverse: H^T, the same matrix) on runs of `size` along the axis, in FP64
        (`hadamard_runs`), rounded to FP32."""
        return rotate_state(x, self.size, self.axis)

    def encode(self, x, *, seed=None, offset=0, random_bits=None) -> PackedState:
        return super().encode(self.rotate(x), seed=seed, offset=offset, random_bits=random_bits)

    def decode(self, packed) -> torch.Tensor:
        return self.rotate(super().decode(packed), inverse=True)

"""State-tensor layout shared by the torch reference and the Triton host code.

A state is `[..., H, P, N]`; inputs with fewer than 3 dims get leading size-1 dims. Leading
indices are independent states, flattened here to one dim B. Blocked formats work on an
"oriented" view `[B, H, R, C]` whose last dim C is the blocked axis: `dstate` keeps
`[B, H, P, N]`, `headdim` transposes to `[B, H, N, P]`.
"""

from __future__ import annotations

import math

import torch

from replayssm_eval.formats import philox, rounding

AXES = ("dstate", "headdim")
# dims of the oriented [B, H, R, C] tensor that one scale group spans
_GROUP_DIMS = {"tensor": (1, 2, 3), "head": (2, 3), "row": (3,)}


def shape3(shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    """`shape` with leading 1s up to 3 dims."""
    shape = tuple(shape)
    return (1,) * (3 - len(shape)) + shape


def as_bhpn(x: torch.Tensor) -> torch.Tensor:
    """FP32 view `[B, H, P, N]` of a state tensor `[..., H, P, N]`."""
    h, p, n = shape3(x.shape)[-3:]
    return x.float().reshape(-1, h, p, n)


def orient(x4: torch.Tensor, axis: str) -> torch.Tensor:
    """`[B, H, P, N]` -> `[B, H, R, C]` with the blocked axis last (contiguous)."""
    return x4 if axis == "dstate" else x4.transpose(-1, -2).contiguous()


def unorient(xo: torch.Tensor, axis: str) -> torch.Tensor:
    return xo if axis == "dstate" else xo.transpose(-1, -2)


def oriented_shape(shape: tuple[int, ...], axis: str) -> tuple[int, ...]:
    """The oriented `(*lead, H, R, C)` of a state of `shape`."""
    *lead, h, p, n = shape3(shape)
    return (*lead, h, n, p) if axis == "headdim" else (*lead, h, p, n)


def pad_to(xo: torch.Tensor, block: int) -> torch.Tensor:
    """Zero-pad the last dim of `xo` to a multiple of `block`."""
    pad = -xo.shape[-1] % block
    return torch.nn.functional.pad(xo, (0, pad)) if pad else xo


def tile_max(a: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """max of `a` `[B, H, R, C]` per tile of `rows` x `cols` (edge tiles shorter): `[B, H, Rt, Ct]`,
    Rt = ceil(R / rows), Ct = ceil(C / cols)."""
    r, c = a.shape[-2:]
    ap = torch.nn.functional.pad(a, (0, -c % cols, 0, -r % rows), value=-float("inf"))  # padding is never a max
    return ap.unflatten(3, (-1, cols)).unflatten(2, (-1, rows)).amax(dim=(3, 5))


def untile(s: torch.Tensor, rows: int, cols: int, r: int, c: int) -> torch.Tensor:
    """Per-tile values `[B, H, Rt, Ct]` spread over their elements `[B, H, r, c]` (`tile_max`'s tiles)."""
    return s.repeat_interleave(rows, 2).repeat_interleave(cols, 3)[..., :r, :c]


def magnitudes(x: torch.Tensor, skip_nan: bool = False) -> torch.Tensor:
    """|x| as a group maximum reads it: NaN propagates, or with skip_nan reads -FLT_MAX (a maximum taken as fmaxf
    from -FLT_MAX skips NaN: the scaled formats' order=mul)."""
    return torch.where(torch.isnan(x), -rounding.FLT_MAX, x.abs()) if skip_nan else x.abs()


def group_amax(xo: torch.Tensor, scale: str, skip_nan: bool = False) -> torch.Tensor:
    """max |x| per scale group of the oriented `[B, H, R, C]`, kept as a broadcastable `[B, H|1, R|1, 1]`; NaN propagates
    unless skip_nan (`magnitudes`)."""
    return group_max(magnitudes(xo, skip_nan), scale)


def group_max(a: torch.Tensor, scale: str) -> torch.Tensor:
    """max of `a` `[B, H, R, C]` per scale group, kept as a broadcastable `[B, H|1, R|1, 1]`."""
    return a.amax(dim=_GROUP_DIMS[scale], keepdim=True)


def group_shape(shape: tuple[int, ...], scale: str, axis: str = "dstate") -> tuple[int, ...]:
    """Shape of the stored FP32 scales: `lead` (tensor), `lead + (H,)` (head), `lead + (H, R)` (row)."""
    *lead, h, r, _ = oriented_shape(shape, axis)
    return tuple(lead) + {"tensor": (), "head": (h,), "row": (h, r)}[scale]


def random_words(x: torch.Tensor, seed: int | None, offset: int, random_bits: torch.Tensor | None,
                 rounds: int = philox.N_ROUNDS, lane_words: tuple[int, ...] | None = None) -> torch.Tensor:
    """uint32 words (int64) with x's shape: `random_bits` as given, else Philox-`rounds` at counters offset + flat index,
    one call per element or, with `lane_words`, one per group of a row (`philox_lane_words`)."""
    if random_bits is not None:
        if tuple(random_bits.shape) != tuple(x.shape):
            raise ValueError(f"random_bits has shape {tuple(random_bits.shape)}, expected x's shape {tuple(x.shape)}")
        return random_bits.to(device=x.device, dtype=torch.int64)
    if lane_words:
        return philox_lane_words(x, seed, offset, lane_words, rounds)
    if seed is None:
        raise ValueError("stochastic rounding needs seed= (an int) or random_bits=; got neither")
    counter = offset + torch.arange(x.numel(), device=x.device, dtype=torch.int64)
    return philox.randint(int(seed), counter, rounds).reshape(x.shape)


def paired_words(words: torch.Tensor) -> torch.Tensor:
    """Words of `cvt.rs.f16x2.f32` fed as Triton's `pack=2` feeds it: elements 2j and 2j+1 along the last dim
    share the word of element 2j, 2j using its bits [12:0] and 2j+1 its bits [28:16] (returned shifted down
    to [12:0]); a last unpaired element keeps its own word."""
    n = words.shape[-1]
    even = words[..., 0::2]  # [..., ceil(N/2)]
    out = torch.stack((even, even >> 16), dim=-1).flatten(-2)  # [..., 2 * ceil(N/2)]
    return out[..., :n]


def philox_lane_words(x: torch.Tensor, seed: int | None, offset: int, lane_words: tuple[int, ...],
                      rounds: int = philox.N_ROUNDS) -> torch.Tensor:
    """uint32 words (int64) with x's shape from one Philox4x32-`rounds` call per G = len(lane_words) elements of a
    row (last dim): element n reads output word lane_words[n % G] of the call at the counter of element n - n % G
    (`offset` + its flat index)."""
    if seed is None:
        raise ValueError("stochastic rounding needs seed= (an int) or random_bits=; got neither")
    n = x.shape[-1] if x.dim() else 1
    index = torch.arange(x.numel(), device=x.device, dtype=torch.int64)  # flat row-major index
    lane = index % n % len(lane_words)
    return lane_draws(int(seed), offset + index - lane, lane, lane_words, rounds).reshape(x.shape)


def lane_draws(seed: int | torch.Tensor, first: torch.Tensor, lane: torch.Tensor, lane_words: tuple[int, ...],
               rounds: int = philox.N_ROUNDS) -> torch.Tensor:
    """Output word lane_words[lane] of the Philox4x32-`rounds` call at counter `first` under key `seed` (an int, or a
    tensor broadcastable with first; lane broadcasts with first): uint32 words as int64, first's broadcast shape."""
    lo, hi = first & 0xFFFFFFFF, (first >> 32) & 0xFFFFFFFF
    zero = torch.zeros_like(lo)
    words = torch.stack(torch.broadcast_tensors(*philox.philox4x32(seed, lo, hi, zero, zero, rounds)), dim=-1)
    pick = torch.tensor(lane_words, device=first.device)[lane].expand(words.shape[:-1])
    return words.gather(-1, pick[..., None]).squeeze(-1)


def prod(shape) -> int:
    return math.prod(shape)

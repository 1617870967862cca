"""`sr_keys` computed on the device: the Philox keys of `replay.keys` without a host round trip.

splitmix64 in int64 torch arithmetic: additions and products wrap modulo 2**64 as the unsigned
ones do, and a logical right shift is the arithmetic one masked to the bits that remain. The
result equals `replay.keys.sr_keys` bit for bit (a signed int64 per sequence), so a static
decode step can key a row from its device-side sequence id when the row is loaded.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _MIX1, _MIX2 = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shr(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values seen as uint64."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    z = z + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def sr_keys_device(seed: int, layer: int, seq_ids: torch.Tensor, copy: int) -> torch.Tensor:
    """[B] int64 keys on seq_ids' device, equal to `sr_keys(seed, layer, seq_ids, copy)`; no host sync."""
    if seq_ids.dtype != torch.int64:
        raise ValueError(f"seq_ids must be int64, got {seq_ids.dtype}")
    z = _splitmix64(torch.full_like(seq_ids, _signed(seed)))
    z = _splitmix64(z ^ _signed(layer))
    z = _splitmix64(z ^ seq_ids)
    return _splitmix64(z ^ _signed(copy))

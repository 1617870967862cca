"""Philox4x32-R (R = 10 by default) in vectorised torch, bit-identical to Triton's `tl.randint(seed, offset)`.

Counter (offset_lo, offset_hi, 0, 0), key (seed_lo, seed_hi), R rounds, output word 0
(Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; Random123).
All arithmetic is int64 with explicit 32-bit masks, so it runs on any device torch supports.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
ROUND_A = 0xD2511F53  # multiplier of word 0
ROUND_B = 0xCD9E8D57  # multiplier of word 2
KEY_A = 0x9E3779B9  # Weyl increment of key word 0
KEY_B = 0xBB67AE85  # Weyl increment of key word 1
N_ROUNDS = 10


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of a * b for a 32-bit constant a and uint32 values b (int64)."""
    # split b into 16-bit halves so every partial product stays below 2^49
    p_lo = a * (b & 0xFFFF)
    p_hi = a * (b >> 16)
    hi = (p_hi + (p_lo >> 16)) >> 16
    lo = (p_lo + ((p_hi & 0xFFFF) << 16)) & _MASK32
    return hi, lo


def philox4x32(
    seed: int | torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,
    n_rounds: int = N_ROUNDS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32 of counter words c0..c3 (int64 tensors holding uint32) under the 64-bit key `seed`."""
    if isinstance(seed, torch.Tensor):
        seed = seed.to(device=c0.device, dtype=torch.int64)
        k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    else:
        seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        k0, k1 = seed & _MASK32, seed >> 32
    for _ in range(n_rounds):
        hi_b, lo_b = _mulhilo(ROUND_B, c2)
        hi_a, lo_a = _mulhilo(ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + KEY_A) & _MASK32
        k1 = (k1 + KEY_B) & _MASK32
    return c0, c1, c2, c3


def randint(seed: int | torch.Tensor, counter: torch.Tensor, n_rounds: int = N_ROUNDS) -> torch.Tensor:
    """uint32 random words (as int64) for 64-bit `counter` values; `seed` is an int or a tensor broadcastable with it.

    Equals `tl.randint(seed, counter, n_rounds)` element for element when `counter` is int64 in Triton.
    """
    counter = torch.as_tensor(counter).to(torch.int64)
    lo = counter & _MASK32
    hi = (counter >> 32) & _MASK32
    zero = torch.zeros_like(lo)
    if isinstance(seed, torch.Tensor):
        seed, lo = torch.broadcast_tensors(seed.to(device=lo.device, dtype=torch.int64), lo)
        hi, zero = hi.expand_as(lo), zero.expand_as(lo)
    return philox4x32(seed, lo, hi, zero, zero, n_rounds)[0]

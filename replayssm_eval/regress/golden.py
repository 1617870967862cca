"""Inputs of the suite's golden-bit metrics: every value is exact in FP32, so each format's bytes are the same on
every CPU, and the bytes hash (`digest`) to one short string per format.

- `integer_state`: integers times powers of two (no rounding before the format's own).
- `tie_state`: values that land exactly on rounding midpoints once scaled: the tie rule decides every one.
- `scale_order_rows`: NVFP4 rows whose second block scale is an E4M3 tie decided by the order of the FP32
  products (`nvfp4_ties.json`, written by scripts/nvfp4_ties.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

SCALE_ORDER_FILE = Path(__file__).with_name("nvfp4_ties.json")

# midpoints of the E2M1 grid, of FP16 / BF16 / E4M3 / E5M2 (scale 1: a row holding 448) and of the integers; each
# FP grid has one midpoint above an even code (RNE rounds down) and one above an odd code (RNE rounds up)
E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
FP_TIES = (1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, 1.0625, 1.1875, 17.0, 144.0, 1.125, 1.375,
           2**-10 + 2**-11, 2**-17, 2**-25)
INT_TIES = (0.5, 1.5, 2.5, 3.5, 64.5, 125.5, 126.5)


def integer_state(shape=(2, 3, 16, 48)) -> torch.Tensor:
    """An FP32 state whose every value is an integer times an exact power of two (no rounding anywhere).

    A multiplicative hash of the flat index gives a 20-bit signed mantissa and an exponent in
    [-12, 11]; each head is scaled by a further 2^(4h) so heads differ in magnitude; every 7th
    block of 16 along the last dim is zero (zero blocks take the formats' special paths).
    """
    idx = torch.arange(torch.Size(shape).numel(), dtype=torch.int64)
    h = (idx * 2654435761) % (1 << 32)
    mantissa = ((h >> 8) % (1 << 20)) - (1 << 19)
    powers = torch.tensor([2.0 ** e for e in range(-40, 41)], dtype=torch.float32)
    exponent = (h % 24) - 12 - 19  # the mantissa is a 20-bit integer
    x = mantissa.to(torch.float32) * powers[exponent + 40]
    x = x.view(shape) * powers[4 * torch.arange(shape[-3]) + 40].view(-1, 1, 1)
    blocks = torch.arange(shape[-1]) // 16
    return torch.where((blocks % 7 == 3), 0.0, x)


def _pattern(values, shape, step: int) -> torch.Tensor:
    """values cycled over a tensor of `shape` with a stride `step` coprime to len(values), signs alternating."""
    idx = torch.arange(torch.Size(shape).numel())
    v = torch.tensor(values, dtype=torch.float32)[(idx * step) % len(values)]
    return (v * torch.where(idx % 3 == 1, -1.0, 1.0)).view(shape)


def tie_state() -> torch.Tensor:
    """[3, 16, 64] (H, P, N): every element but each row's first sits on a rounding midpoint of some format.

    head 0: FP16 / BF16 / E4M3 / E5M2 midpoints, row amax 448 (FP8 scale 1);
    head 1: integer midpoints, row amax 127 (INT8 scale 1);
    head 2: NVFP4 / MX blocks of 16: k x E2M1 midpoints with k a power of two, and 6k at the block's start,
            each row's first block 2688 x ... (S_enc = 1, so E4M3 block scale k and the scaled elements are ties).
    """
    x = torch.zeros(3, 16, 64)
    x[0] = _pattern(FP_TIES, (16, 64), 5)
    x[0, :, 0] = 448.0
    x[1] = _pattern(INT_TIES, (16, 64), 3)
    x[1, :, 0] = 127.0
    ks = 2.0 ** torch.tensor([-9.0, -1.0, 0.0, 3.0, -7.0, 5.0, 1.0, -3.0])  # [8]
    k = ks[(torch.arange(16 * 4) * 3) % 8].view(16, 4, 1)  # [P, blocks, 1]
    k[:, 0] = 448.0
    blocks = _pattern(E2M1_TIES, (16, 4, 16), 2) * k  # [P, blocks, 16]
    blocks[..., 0] = 6.0 * k[..., 0]
    x[2] = blocks.flatten(-2)
    return x


def scale_order_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """x [64, 1, 1, 32] and the block scales TransformerEngine's order gives [64, 2] (uint8 E4M3 codes)."""
    rows = json.loads(SCALE_ORDER_FILE.read_text(encoding="utf-8"))["rows"]
    x = torch.tensor(np.array([[int(h, 16) for h in r["x"]] for r in rows], np.uint32).view(np.float32))  # [64, 32]
    return x.view(len(rows), 1, 1, 32), torch.tensor([r["scales"] for r in rows], dtype=torch.uint8)


def digest(tensors) -> str:
    """SHA-256 (16 hex digits) of the dtypes, shapes and bytes of `tensors` (None entries skipped)."""
    h = hashlib.sha256()
    for t in tensors:
        if t is not None:
            t = t.detach().cpu().contiguous()
            h.update(str(t.dtype).encode() + str(tuple(t.shape)).encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]

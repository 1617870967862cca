"""Find NVFP4 rows whose second block scale depends on the order of operations, and write them as golden rows.

TE's order is `bmax * (S_enc * fp32(1/6))`; `(bmax / 6) * S_enc` rounds to FP32 differently for some
inputs, and the golden rows are those where the two FP32 products fall on different sides of an E4M3
rounding midpoint (so the stored block scale byte differs). Row: 32 FP32 values, block 0 holds the
row's amax (the global scale group is the row), block 1 a max bmax set near `m * 6 / S_enc` for an
E4M3 midpoint m, then nudged by a few ulps.

    python scripts/nvfp4_ties.py replayssm_eval/regress/nvfp4_ties.json
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

F32 = np.float32


def e4m3_byte(v: F32) -> int:
    return int(torch.tensor([min(float(v), 448.0)]).to(torch.float8_e4m3fn).view(torch.uint8))


def find(n_rows: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    mids = (grid[1:] + grid[:-1]) / 2
    rows = []
    while len(rows) < n_rows:
        amax = F32(rng.uniform(0.5, 4.0))
        s_enc = F32(F32(2688.0) / amax)
        m = F32(rng.choice(mids[mids > 2.0**-6]))  # normal E4M3 midpoints
        bmax = F32(F32(m) * F32(6.0) / s_enc)
        bmax = np.nextafter(bmax, F32(np.inf) if rng.random() < 0.5 else F32(0), dtype=F32)
        for _ in range(int(rng.integers(0, 3))):
            bmax = np.nextafter(bmax, F32(np.inf), dtype=F32)
        if not bmax < amax:
            continue
        te = F32(bmax * F32(s_enc * F32(1 / 6)))
        other = F32(F32(bmax / F32(6.0)) * s_enc)
        if e4m3_byte(te) == e4m3_byte(other):
            continue
        x = np.concatenate([[amax], rng.uniform(-1, 1, 15) * amax, [-bmax], rng.uniform(-1, 1, 15) * bmax]).astype(F32)
        rows.append({"x": [f"{v:08x}" for v in x.view(np.uint32)], "scales": [e4m3_byte(F32(448.0)), e4m3_byte(te)],
                     "other_order": e4m3_byte(other)})
    return rows


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        f.write('{"rows": [\n' + ",\n".join(json.dumps(row) for row in find(64)) + "\n]}\n")

"""The golden NVFP4 tie rows (nvfp4_ties.json, written by scripts/nvfp4_ties.py)."""

import json
from pathlib import Path

import numpy as np
import torch


def tie_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """64 rows whose second block scale is an E4M3 tie decided by the order of the FP32 products: x [64, 1, 1, 32]
    and the expected block scales [64, 2] (uint8 E4M3 codes)."""
    rows = json.loads((Path(__file__).parent / "nvfp4_ties.json").read_text())["rows"]
    x = torch.tensor(np.array([[int(h, 16) for h in r["x"]] for r in rows], np.uint32).view(np.float32))  # [64, 32]
    return x.view(64, 1, 1, 32), torch.tensor([r["scales"] for r in rows], dtype=torch.uint8)

"""The golden NVFP4 tie rows (the package's regress/nvfp4_ties.json, written by scripts/nvfp4_ties.py)."""

import torch

from replayssm_eval.regress.golden import scale_order_rows


def tie_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """64 rows whose second block scale is an E4M3 tie decided by the order of the FP32 products: x [64, 1, 1, 32]
    and the expected block scales [64, 2] (uint8 E4M3 codes)."""
    return scale_order_rows()

"""GPU check of the in-kernel Hadamard rotation (`formats.device.hadamard_tile`) against `rotation.hadamard_runs`.

    python benchmarks/gpu_check_rotation.py            # on a CUDA machine (or the Triton interpreter on CPU)

Each row rotates random FP32 tiles [R, C] (magnitudes spread over 2^-20..2^20) by H_ROT on runs of ROT columns in a
kernel, loaded as they lie (`plain`) or loaded as [C, R] and transposed in registers (`trans`, as a chunked
kernel's d_state-axis rounding), and counts the elements that differ from the FP64 torch butterflies rounded to FP32.
Where they differ it also reports what the kernel's output does equal: the rotation in FP32 arithmetic, the
rotation scaled once at the end, or torch's values in another order within each row (a layout fault).
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch
import triton
import triton.language as tl

from replayssm_eval.formats import device
from replayssm_eval.formats.rotation import hadamard_runs

SHAPES = [(16, 16, 2), (16, 32, 4), (32, 32, 8), (64, 32, 16), (128, 32, 32), (128, 64, 32), (64, 128, 8), (16, 128, 128)]


@triton.jit
def _rotate_kernel(x_ptr, y_ptr, ROT: tl.constexpr, R: tl.constexpr, C: tl.constexpr, TRANS: tl.constexpr):
    # x, y: [B, R, C]; TRANS: load x's tile as [C, R] (x stored transposed) and rotate its transpose
    b = tl.program_id(0)
    rows, cols = tl.arange(0, R), tl.arange(0, C)
    elem = rows[:, None] * C + cols[None, :]  # [R, C]
    if TRANS:
        x = tl.trans(tl.load(x_ptr + b * R * C + cols[:, None] * R + rows[None, :]))  # [C, R] -> [R, C]
    else:
        x = tl.load(x_ptr + b * R * C + elem)
    tl.store(y_ptr + b * R * C + elem, device.hadamard_tile(x, ROT, R, C))


def _fp32_runs(x: torch.Tensor, size: int) -> torch.Tensor:
    """hadamard_runs' butterflies in FP32 arithmetic, a suspect contraction of the kernel's FP64 ones."""
    return hadamard_runs(x.float(), size).float()


def _scaled_once(x: torch.Tensor, size: int) -> torch.Tensor:
    """The butterflies without the interleaved halvings, one FP64 product by 1 / sqrt(size) at the end."""
    y = hadamard_runs(x.double(), size) * math.sqrt(size)  # undo the product: exact for the sums here
    return (y * (1 / math.sqrt(size))).float()


def check(rows: int, cols: int, rot: int, trans: bool, dev: str, batch: int = 4) -> dict:
    g = torch.Generator().manual_seed(rows * 1000 + cols + rot)
    x = torch.randn(batch, rows, cols, generator=g) * torch.exp2(torch.randint(-20, 20, (batch, rows, cols), generator=g))
    want = hadamard_runs(x.double(), rot).float()  # [B, R, C]
    src = x.transpose(-1, -2).contiguous() if trans else x
    y = torch.empty(batch, rows, cols, device=dev)
    _rotate_kernel[(batch,)](src.to(dev), y, ROT=rot, R=rows, C=cols, TRANS=trans)
    got = y.cpu()
    bad = got.view(torch.int32) != want.view(torch.int32)
    same_rows = torch.equal(got.sort(-1).values, want.sort(-1).values)
    return {"shape": f"{rows}x{cols}", "rot": rot, "load": "trans" if trans else "plain", "differ": int(bad.sum()),
            "of": bad.numel(), "max_rel": float(((got - want).abs() / want.abs().amax()).max()),
            "is_fp32_math": torch.equal(got, _fp32_runs(x, rot)), "is_scaled_once": torch.equal(got, _scaled_once(x, rot)),
            "rows_permuted": same_rows and bool(bad.any()),
            "first": "" if not bad.any() else str(tuple(int(i) for i in bad.nonzero()[0]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    results = [check(r, c, rot, trans, args.device) for (r, c, rot), trans in itertools.product(SHAPES, (False, True))]
    keys = list(results[0])
    print(" | ".join(keys))
    for row in results:
        print(" | ".join(str(row[k]) for k in keys))
    failed = sum(row["differ"] > 0 for row in results)
    print(f"{len(results) - failed} / {len(results)} bit-identical")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()

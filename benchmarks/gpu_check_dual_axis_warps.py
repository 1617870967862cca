"""Does STEPQuant's dual-axis fit give the same bits at every warp count? Compiled on the GPU, the fit of whole
oriented heads (`formats.device.dual_axis_fit`, the chunked kernels' and the encode launch's code) at 1 to 32 warps,
with the head loaded (a blocked layout) or made by a `tl.dot` (an MMA layout, as the chunked kernels' states), each
intermediate (row sums, row factors, column maxima, first column factors, the update's sums, final factors,
codes) against the same launch at 16 warps and the codes against the torch format. Prints a table: per warp count
and head shape, the elements of each intermediate that differ. GPU only (the interpreter ignores warps).

    python benchmarks/gpu_check_dual_axis_warps.py
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from replayssm_eval.formats import get_format
from replayssm_eval.formats.device import dual_axis_row_sums, fp16_factor, round_int

STAGES = ("sums", "r", "wide", "c0", "num", "den", "c", "z")


@triton.jit
def _fit_stages_kernel(x_ptr, a_ptr, b_ptr, scale_ptr, sums_ptr, r_ptr, wide_ptr, c0_ptr, num_ptr, den_ptr, c_ptr,
                       z_ptr, R: tl.constexpr, C: tl.constexpr, QMAX: tl.constexpr, DOT: tl.constexpr):
    """`dual_axis_fit` of head program_id(0) of x [heads, R, C], its steps written out to store each intermediate
    (`device.dual_axis_fit` keeps them in registers); DOT: x made in the kernel as (a b) * scale from a [heads, R,
    16], b [heads, 16, C] (small integers in FP16: an exact product) and scale [heads, R] (powers of two)."""
    h = tl.program_id(0).to(tl.int64)
    rows, cols, inner = tl.arange(0, R), tl.arange(0, C), tl.arange(0, 16)
    if DOT:
        a = tl.load(a_ptr + h * R * 16 + rows[:, None] * 16 + inner[None, :])  # [R, 16]
        b = tl.load(b_ptr + h * 16 * C + inner[:, None] * C + cols[None, :])  # [16, C]
        x = tl.dot(a, b) * tl.load(scale_ptr + h * R + rows)[:, None]  # [R, C]
    else:
        x = tl.load(x_ptr + h * R * C + rows[:, None] * C + cols[None, :])  # [R, C]
    sums = dual_axis_row_sums(x)  # [R, 1] FP64
    zero = tl.zeros_like(x)
    r = fp16_factor(tl.sqrt(sums / C).to(tl.float32))
    wide = tl.max(tl.math.div_rn(tl.abs(x), r + zero), axis=0, keep_dims=True)
    c0 = fp16_factor(tl.math.div_rn(wide, tl.full(wide.shape, QMAX, tl.float32)))
    v = (r * round_int(tl.math.div_rn(x, (r * c0) + zero), QMAX)).to(tl.float64)
    num = tl.sum(v * x.to(tl.float64), axis=0, keep_dims=True)
    den = tl.sum(v * v, axis=0, keep_dims=True)
    c = tl.where(den > 0, fp16_factor((num / tl.where(den > 0, den, 1.0)).to(tl.float32)), c0)
    z = round_int(tl.math.div_rn(x, (r * c) + zero), QMAX)
    tl.store(sums_ptr + h * R + rows[:, None], sums)
    tl.store(r_ptr + h * R + rows[:, None], r)
    tl.store(wide_ptr + h * C + cols[None, :], wide)
    tl.store(c0_ptr + h * C + cols[None, :], c0)
    tl.store(num_ptr + h * C + cols[None, :], num)
    tl.store(den_ptr + h * C + cols[None, :], den)
    tl.store(c_ptr + h * C + cols[None, :], c)
    tl.store(z_ptr + h * R * C + rows[:, None] * C + cols[None, :], z)


def fit_stages(x: torch.Tensor, qmax: float, warps: int, made: tuple | None) -> dict[str, torch.Tensor]:
    """Each intermediate of the fit of x [heads, R, C] (R, C powers of two) at `warps` warps; made: (a, b, scale),
    x = (a @ b) * scale, to make x in the kernel by a `tl.dot`."""
    heads, rows, cols = x.shape
    out = {name: torch.empty(heads, n, dtype=dtype, device=x.device)
           for name, n, dtype in (("sums", rows, torch.float64), ("r", rows, torch.float32),
                                  ("wide", cols, torch.float32), ("c0", cols, torch.float32),
                                  ("num", cols, torch.float64), ("den", cols, torch.float64),
                                  ("c", cols, torch.float32), ("z", rows * cols, torch.float32))}
    _fit_stages_kernel[(heads,)](x, *(made or (x, x, x)), *(out[s] for s in STAGES), R=rows, C=cols, QMAX=qmax,
                                 DOT=made is not None, num_warps=warps)
    return out


def differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements that differ (NaN against NaN agrees)."""
    return int(((a != b) & ~(a.isnan() & b.isnan())).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--warps", default="1,2,4,8,16,32")
    parser.add_argument("--shapes", default="128x128,128x64,64x128,128x16", help="head shapes RxC")
    parser.add_argument("--widths", default="6,8")
    args = parser.parse_args()
    warps = [int(w) for w in args.warps.split(",")]
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    g = torch.Generator(device="cuda").manual_seed(0)
    print("| head [R, C] | made by | width | warps | " + " | ".join(STAGES) + " | values vs torch |")
    print("|---|---|---:|---:|" + "---:|" * (len(STAGES) + 1))
    for (rows, cols), dot, width in itertools.product(shapes, (False, True), map(int, args.widths.split(","))):
        if dot:
            a = torch.randint(-8, 9, (args.heads, rows, 16), device="cuda", generator=g).half()
            b = torch.randint(-8, 9, (args.heads, 16, cols), device="cuda", generator=g).half()
            scale = torch.exp2(torch.randint(-4, 4, (args.heads, rows), device="cuda", generator=g).float())
            made = (a, b, scale)
            x = (a.float() @ b.float()) * scale[:, :, None]  # exact: integer sums below 2^11 times powers of two
        else:
            made = None
            x = torch.randn(args.heads, rows, cols, device="cuda", generator=g)
            x *= torch.exp2(torch.randint(-4, 4, (args.heads, rows, 1), device="cuda", generator=g).float())
        qmax = float(2 ** (width - 1) - 1)
        fmt = get_format("dualaxis" if width == 6 else f"dualaxis:width={width}")
        torch_value = fmt.quantize(x.transpose(1, 2)[:, None]).squeeze(1).transpose(1, 2)  # key rows along R
        base = fit_stages(x, qmax, 16, made)
        for w in warps:
            got = base if w == 16 else fit_stages(x, qmax, w, made)
            value = got["z"].view(x.shape) * (got["r"][:, :, None] * got["c"][:, None, :])
            cells = [str(differing(got[s], base[s])) for s in STAGES]
            print(f"| [{rows}, {cols}] | {'tl.dot' if dot else 'load'} | {width} | {w} | " + " | ".join(cells)
                  + f" | {differing(value, torch_value)} |", flush=True)


if __name__ == "__main__":
    main()

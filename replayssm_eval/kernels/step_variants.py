"""The variants of a one-token decode step and the kernel launches each runs, shared by every family's step launcher.

A step's variant (`FOLDS`) says which rows fold after the token: none, some or all. Where some rows fold, a family's
launcher runs its reading path for the rows that do not and its folding path for those that do, as two launches
(`step_launches`) whose programs of the other launch's rows return at once (`other_launch_row`): a row's bits never
depend on whether other rows fold at the token, and a row that does not fold costs what it costs in a step where no
row folds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FOLDS = ("none", "some", "all")

_LAUNCHES = {"none": ((False, False),), "some": ((False, True), (True, True)), "all": ((True, False),)}


def step_variant(fold: torch.Tensor) -> str:
    """The variant of a step whose rows fold where fold [B] (bool) is set (reads the device: eager steps only)."""
    return "all" if bool(fold.all()) else "some" if bool(fold.any()) else "none"


def read_hi_flags(read_hi: torch.Tensor | None, fold: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(the per-row S_hi flags a step kernel loads, HI_AT_FOLD) of a step whose rows read S_hi where read_hi [B] int8
    is set, or, where read_hi is None, exactly where they fold (a fixed window: its flush's output reads S_hi, every
    other token the read copy). With HI_AT_FOLD a kernel loads no flag: a reading launch compiles without the S_hi
    path and a folding launch without the read copy's, which frees registers (BENCHMARKS.md, Decode step)."""
    return (fold, True) if read_hi is None else (read_hi.contiguous(), False)


def step_launches(folds: str) -> tuple[tuple[bool, bool], ...]:
    """The launches of variant `folds`, as (fold path, split) pairs: "none" one reading launch, "all" one folding
    launch, "some" a reading launch for the rows that do not fold and a folding launch for those that do, each split
    (`other_launch_row`)."""
    if folds not in _LAUNCHES:
        raise ValueError(f"unknown step variant {folds!r}; known: {', '.join(FOLDS)}")
    return _LAUNCHES[folds]


@triton.jit
def row_reads_hi(rhi_ptr, b, FOLD: tl.constexpr, HI_AT_FOLD: tl.constexpr):
    """Whether row b of a step launch reads S_hi (`read_hi_flags`): with HI_AT_FOLD exactly the rows of a folding
    launch (FOLD, a constexpr: the other path is not compiled), else its flag rhi[b] != 0 ([B] int8)."""
    if HI_AT_FOLD:
        return FOLD
    else:
        return tl.load(rhi_ptr + b) != 0


@triton.jit
def other_launch_row(fold_ptr, b, FOLD: tl.constexpr, SPLIT: tl.constexpr):
    """Whether row b belongs to the other launch of a split pair (`step_launches`): a split folding launch (FOLD)
    takes the rows with fold[b] != 0, a split reading launch the others, a launch not split every row.
    fold: [B] int8."""
    other = False
    if SPLIT:
        if FOLD:
            other = tl.load(fold_ptr + b) == 0
        else:
            other = tl.load(fold_ptr + b) != 0
    return other

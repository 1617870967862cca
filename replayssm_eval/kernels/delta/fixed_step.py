"""The delta rule's fixed-buffer step (`KernelFamily.fixed_step` of GDN and KDA, run by `kernels.static_step`).

One launch of the family's single-token kernel through the launcher its eager step uses (`launch_replay_step` of
`gdn.triton_step` / `kda.triton_step`), the token's entries appended to the ring at each row's window phase, and the folded
rows' ring entries emptied (as `delta._common` does at a flush), writing those rows only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from replayssm_eval.kernels.delta.triton_step import read_copy_format
from replayssm_eval.replay.buffer_round import buffer_kind

if TYPE_CHECKING:
    from replayssm_eval.kernels.static_step import StaticState


def fixed_step(launch: Callable, st: StaticState, inputs: tuple, fold: torch.Tensor, folds: str) -> torch.Tensor:
    """launch: the family's `launch_replay_step`; inputs: q, k [B, 1, H, K], v [B, 1, HV, V], g [B, 1, HV] (GDN) or
    [B, 1, HV, K] (KDA), beta [B, 1, HV], fp32; fold: [B] bool, the rows that fold after this token; folds: the step
    variant ("none": no row folds, "all": every row does). Returns o [B, 1, HV, V] fp32."""
    # q, k [B, H, K]; v [B, HV, V]; g [B, HV] or [B, HV, K]; beta [B, HV]
    q, k, v, g, beta = (t[:, 0].contiguous() for t in inputs)
    # buffered inputs in the buffer dtype, as `delta._common.prepare_inputs`: k, beta, and v with the closed fold
    rounded = st.config.round_buffered
    k, beta = rounded(k), rounded(beta)
    closed = st.config.gdn_fold == "closed"
    if closed:
        v = rounded(v)
    flush = folds != "none"
    u = torch.empty(v.shape, device=v.device)  # [B, HV, V]
    o = torch.empty_like(u)
    fold8 = fold.to(torch.int8)
    token = dict(q=q, k=k, v=v, g=g, beta=beta)
    launch(st.hi, st.packed, read_copy_format(st.config), st.buffer, st.count, token, None, fold8, u, o,
           st.fold_out if flush else u, folds=folds, closed=closed, shared=st.config.shared,
           groups=v.shape[1] // k.shape[1],
           eps=st.config.skip_read_below, buf_kind=buffer_kind(st.config))
    rows = torch.arange(v.shape[0], device=v.device)
    entry = dict(token, u=rounded(u))
    for name, t in st.buffer.items():
        t.index_put_((rows, st.count), entry[name])
    if flush:  # the folded rows start an empty window
        for t in st.buffer.values():
            if folds == "all":
                t.zero_()
            else:
                zero_rows_(t, fold8)
    return o[:, None]  # [B, 1, HV, V]


@triton.jit
def _zero_rows_kernel(t_ptr, rows_ptr, ROW_ELEMS: tl.constexpr, BLOCK: tl.constexpr):
    # t: [B, ROW_ELEMS]; rows: [B] int8, the rows to zero (the others are not touched)
    b = tl.program_id(0)
    if tl.load(rows_ptr + b) == 0:
        return
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    tl.store(t_ptr + b.to(tl.int64) * ROW_ELEMS + offs, tl.zeros((BLOCK,), dtype=t_ptr.dtype.element_ty),
             mask=offs < ROW_ELEMS)


def zero_rows_(t: torch.Tensor, rows: torch.Tensor) -> None:
    """t[b] = 0 where rows[b] != 0, in place, writing those rows only (a masked fill reads and writes all of t).
    t: contiguous [B, ...]; rows: [B] int8."""
    row_elems = t[0].numel() if t.shape[0] else 0
    if row_elems:
        block = min(1024, triton.next_power_of_2(row_elems))
        _zero_rows_kernel[(t.shape[0], triton.cdiv(row_elems, block))](t, rows, ROW_ELEMS=row_elems, BLOCK=block)

"""Mamba-2's fixed-buffer step (`KernelFamily.fixed_step`, run by `kernels.static_step.StaticState`).

One launch of the single-token kernel `_replay_step_kernel` over the state's fixed buffers: the token's x, B and dt
appended at each row's window phase, y read from the checkpoint and the buffer, the FP32 fold of the folding rows
written to `fold_out`. The ring keeps its entries at a fold (they are overwritten from phase 0 on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton

from replayssm_eval.kernels.mamba2.triton_step import _replay_step_kernel, read_layout, step_grid, step_launch_config
from replayssm_eval.replay.buffer_round import buffer_kind

if TYPE_CHECKING:
    from replayssm_eval.kernels.static_step import StaticState


def fixed_step(st: StaticState, inputs: tuple, fold: torch.Tensor, folds: str) -> torch.Tensor:
    """inputs: x [B, 1, H, P], dt [B, 1, H], A [H], B, C [B, 1, G, N], D [H], fp32; fold: [B] bool, the rows that fold
    after this token; folds: the step variant ("none" writes no fold). Returns y [B, 1, H, P] fp32."""
    x, dt, A, B, C, D = inputs
    flush = folds != "none"
    rows = torch.arange(x.shape[0], device=x.device)
    rounded = st.config.round_buffered  # x and B buffered in the buffer dtype, as `mamba2._common.prepare_inputs`
    for key, new in (("x", rounded(x)), ("B", rounded(B)), ("dt", dt)):
        st.buffer[key].index_put_((rows, st.count), new[:, 0])
    buf = st.buffer
    batch, E, H, P = buf["x"].shape
    G, N = buf["B"].shape[2], buf["B"].shape[3]
    read, group, (data, scales, gs), nb = read_layout(st.replay_state(), st.config)
    y = torch.empty(batch, H, P, dtype=torch.float32, device=x.device)
    fold8 = fold.to(torch.int8)
    cfg = step_launch_config(batch, H, P, read)
    skip = st.config.skip_read_below
    _replay_step_kernel[step_grid(batch, H, P, cfg["BLOCK_P"], cfg["TILES"])](
        buf["x"], buf["B"], buf["dt"], C[:, 0].contiguous(), st.count, fold8, fold8, st.hi, data,
        data if scales is None else scales, data if gs is None else gs, A.contiguous(), y, st.fold_out if flush else y,
        E, H, G, H // G, float(skip or 0.0),
        P=P, N=N, NB=nb, READ=read, GROUP=group, SKIP=skip is not None, FOLD=flush, BUF=buffer_kind(st.config),
        BLOCK_E=max(2, triton.next_power_of_2(E)), BLOCK_N=triton.next_power_of_2(N),
        BLOCK_S=max(16, triton.next_power_of_2(nb)) // 16, **cfg,
    )
    return (y + D[:, None] * x[:, 0])[:, None]  # [B, 1, H, P]

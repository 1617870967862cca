"""Mamba-2's fixed-buffer step (`KernelFamily.fixed_step`, run by `kernels.static_step.StaticState`).

The single-token kernel over the state's fixed buffers through the launcher the eager step uses
(`triton_step.launch_replay_step`): the token's x, B and dt appended at each row's window phase, y read from the
checkpoint and the buffer, the FP32 fold of the folding rows written to `fold_out`. Where some rows fold, a reading
launch takes the rows that do not and a folding launch those that do (`step_variants.step_launches`). The ring keeps
its entries at a fold (they are overwritten from phase 0 on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from replayssm_eval.kernels.mamba2.triton_step import launch_replay_step, read_layout
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
    batch, _, H, P = buf["x"].shape
    y = torch.empty(batch, H, P, dtype=torch.float32, device=x.device)
    fold8 = fold.to(torch.int8)
    launch_replay_step(buf["x"], buf["B"], buf["dt"], C[:, 0].contiguous(), st.count, None, fold8, A.contiguous(),
                       st.hi, read_layout(st.replay_state(), st.config), y, st.fold_out if flush else y, folds=folds,
                       skip=st.config.skip_read_below, buf_kind=buffer_kind(st.config))
    return (y + D[:, None] * x[:, 0])[:, None]  # [B, 1, H, P]

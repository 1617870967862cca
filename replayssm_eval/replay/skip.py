"""Which checkpoint reads `#skip=EPS` skips: the (token, head) pairs whose decay since the checkpoint is below EPS.

The criterion is the chunked kernels' own: the log-decays of a segment (the entries still buffered
from the previous call, then the call's tokens, up to and including the fold) are summed with a
cumulative sum from the checkpoint, and a head skips the read where exp(sum) < EPS. Mamba-2's
log-decay is dt * A, GDN's is g; KDA's is g per key channel, and a head skips where every channel's
decay is below EPS (the largest channel sum). A skipped read at a token that reads S_hi (a flush) also drops S_hi
from the fold, as the kernels do.
"""

from __future__ import annotations

import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.schedule import ScheduleState, plan_tokens


def skipped_reads(log_decay: torch.Tensor, buffered: torch.Tensor, schedule: ScheduleState, config: ReplayConfig,
                  seq_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(skipped [B, T, H] bool, read_hi [B, T] bool) of one call.

    log_decay [B, T, H] or [B, T, H, K] (per channel): the call's per-token log-decays; buffered [B, cap, H(, K)]: the log-decays of the
    entries carried in the buffer (the first schedule.count[b] are valid); schedule: the state's
    schedule at the start of the call. read_hi says which copy each token reads (S_hi at a flush).
    """
    batch, tokens, heads = log_decay.shape[:3]
    plan, _ = plan_tokens(config, schedule, tokens, seq_ids)
    if config.skip_read_below is None or tokens == 0:
        return torch.zeros(batch, tokens, heads, dtype=torch.bool, device=log_decay.device), plan.read_hi
    h0 = schedule.count.to(log_decay.device)  # [B]
    fold = plan.fold_after.to(torch.int64)  # [B, T]
    seg = fold.cumsum(1) - fold  # [B, T]: segment of each token
    n = torch.arange(tokens, device=log_decay.device)
    last_fold = torch.where(plan.fold_after, n, -1).cummax(1).values
    prev_fold = torch.cat([torch.full_like(last_fold[:, :1], -1), last_fold[:, :-1]], 1)
    pos = torch.where(prev_fold < 0, h0[:, None] + n, n - prev_fold - 1)  # [B, T]: place in its segment
    segments, length = int(seg.max()) + 1, int(torch.cat([pos.flatten(), h0]).max()) + 1
    grid = log_decay.new_zeros(batch, segments, length, *log_decay.shape[2:])  # entries after a segment's end stay zero
    rows = torch.arange(batch, device=log_decay.device)
    carried = torch.arange(buffered.shape[1], device=log_decay.device)[None] < h0[:, None]  # [B, cap]
    b_idx, i_idx = carried.nonzero(as_tuple=True)
    grid[b_idx, 0, i_idx] = buffered[b_idx, i_idx].to(grid.dtype)
    grid[rows[:, None], seg, pos] = log_decay
    cum = grid.cumsum(2)[rows[:, None], seg, pos]  # [B, T, H(, K)]: log of the decay since the checkpoint
    if cum.dim() == 4:  # per channel: the head reads while any channel has not decayed
        cum = cum.amax(-1)
    return torch.exp(cum) < config.skip_read_below, plan.read_hi

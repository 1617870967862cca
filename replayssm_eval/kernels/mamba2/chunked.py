"""Teacher-forced ReplaySSM for a Mamba-2 layer: parallel inside each segment, sequential between checkpoints.

A segment is the run of buffer entries between two checkpoints (the entries still buffered from
the previous call come first). Everything inside a segment is computed at once, SSD style; the
checkpoints are passed from segment to segment with `write_checkpoint` at every fold, so the
outputs, checkpoints and rounding decisions are those of `decode_reference` for any plan (any
window phase per sequence, speculative plans included).

Memory: the padded inputs are [B, S, L, ...] (S segments of at most L entries); the per-segment
states are materialised for a block of segments at a time.
"""

from __future__ import annotations

import torch

from replayssm_eval.kernels.mamba2._common import Inputs, group_heads, merge_packed
from replayssm_eval.replay.schedule import TokenPlan
from replayssm_eval.replay.state import ReplayState, write_checkpoint, write_checkpoint_packed

_BLOCK_ELEMENTS = 1 << 25  # per-segment states held at once: segments * B * H * P * N


class Segments:
    """Where every entry of the call sits in the padded [B, S, L] segment grid.

    The stream of sequence b is its h0[b] buffered entries followed by its T new tokens; segment s
    holds the entries after the s-th fold of the call, so segment s ends in checkpoint
    `checkpoint[b] + s + 1` if it folds.
    """

    def __init__(self, inp: Inputs, plan: TokenPlan):
        batch, tokens = inp.x.shape[:2]
        device = inp.x.device
        self.h0 = inp.state.schedule.count  # [B]
        fold = plan.fold_after.to(torch.int64)  # [B, T]
        self.seg = fold.cumsum(1) - fold  # [B, T]: segment of each new token
        # in-segment position: tokens of segment 0 follow the buffered entries
        n = torch.arange(tokens, device=device)
        last_fold = torch.where(plan.fold_after, n, -1).cummax(1).values  # [B, T]: newest fold at or before n
        prev_fold = torch.cat([torch.full_like(last_fold[:, :1], -1), last_fold[:, :-1]], 1)
        self.pos = torch.where(prev_fold < 0, self.h0[:, None] + n, n - prev_fold - 1)  # [B, T]
        self.num_folds = plan.fold_after.sum(1)  # [B]
        self.last_fold = last_fold[:, -1] if tokens else self.h0.new_full(self.h0.shape, -1)  # [B]: last folding token
        if plan.shape is not None:  # the host knows the schedule: no device read
            length = max(plan.shape.longest, *plan.shape.counts, 1)
            num_folds = list(plan.shape.num_folds)
        else:
            span = torch.cat([self.pos.flatten(), self.h0 - 1, torch.zeros(1, dtype=torch.int64, device=device)])
            length, *num_folds = torch.cat([span.max()[None] + 1, self.num_folds]).tolist()  # the call's one host read
        segments = max(num_folds, default=0) + 1
        self.length, self.segments = length, segments
        # [B, S]: segment s ends in a fold; host copy to steer the loop
        self.folds = torch.arange(segments, device=device)[None] < self.num_folds[:, None]
        self.folds_host = [[s < n for n in num_folds] for s in range(segments)]  # [S][B]
        self.index = self.seg * length + self.pos  # [B, T] flat index in the grid
        # [B * S * L]: the row of each grid entry in (tokens, carried entries, a zero row), for `pad`'s one gather
        size = segments * length
        self.capacity = cap = inp.capacity  # buffer slots per sequence
        source = torch.full((batch, size + 1), batch * (tokens + cap), device=device)  # last column: a dump
        source.scatter_(1, self.index, torch.arange(batch * tokens, device=device).view(batch, tokens))
        i = torch.arange(cap, device=device)[None]  # [1, cap]
        slots = torch.where(i < self.h0[:, None], i, size)  # [B, cap]: carried entries lead segment 0
        source.scatter_(1, slots, batch * tokens + torch.arange(batch * cap, device=device).view(batch, cap))
        self.source = source[:, :size].flatten()
        self.read_hi = self.pad(plan.read_hi, None)  # [B, S*L]

    def pad(self, new: torch.Tensor, buffered: torch.Tensor | None) -> torch.Tensor:
        """new [B, T, ...] and buffered [B, cap, ...] (entries < h0 valid; zeros where None) -> zero-padded
        [B, S*L, ...], by one gather."""
        batch, entry = new.shape[0], new.shape[2:]
        carried = (new.new_zeros(batch * self.capacity, *entry) if buffered is None
                   else buffered.flatten(0, 1).to(new.dtype))
        rows = torch.cat([new.flatten(0, 1), carried, new.new_zeros(1, *entry)])
        return rows[self.source].view(batch, self.segments * self.length, *entry)

    def new_buffers(self, news: dict[str, torch.Tensor], buffered: dict[str, torch.Tensor],
                    count: torch.Tensor) -> dict[str, torch.Tensor]:
        """The buffers after the call, {key: [B, cap, ...]}: entries of each sequence's last segment, from the call's
        tokens news[key] [B, T, ...] and the entries buffered[key] [B, cap, ...] carried into it."""
        cap, tokens = self.capacity, news["x"].shape[1]
        i = torch.arange(cap, device=self.h0.device)[None]  # [1, cap]
        # stream position of entry i of the last segment
        start = torch.where(self.num_folds > 0, self.h0 + self.last_fold + 1, 0)  # [B]
        p = start[:, None] + i  # [B, cap]
        tok = (p - self.h0[:, None]).clamp(0, max(tokens - 1, 0))
        old, kept = p < self.h0[:, None], i < count[:, None]
        p = p.clamp(max=cap - 1)
        out = {}
        for key, new in news.items():
            entry = lambda t: t.view(*t.shape, *[1] * (new.dim() - 2))  # noqa: E731  [B, cap] -> [B, cap, 1...]
            from_new = torch.gather(new, 1, entry(tok).expand(-1, -1, *new.shape[2:]))
            from_buf = torch.gather(buffered[key], 1, entry(p).expand(-1, -1, *new.shape[2:]))
            out[key] = torch.where(entry(kept), torch.where(entry(old), from_buf, from_new), 0.0)
        return out


def chunked_torch(inp: Inputs, plan: TokenPlan, after) -> tuple[torch.Tensor, ReplayState]:
    batch, tokens, heads, head_dim, groups, d_state = inp.dims
    state, config = inp.state, inp.config
    if tokens == 0:
        return inp.x.to(inp.out_dtype), ReplayState(state.hi, state.lo, state.buffer, after, state.checkpoint,
                                                    state.seq_ids, state.layer, state.lo_packed, state.residual)
    seg = Segments(inp, plan)
    S, L = seg.segments, seg.length
    grid = lambda t: t.view(batch, S, L, *t.shape[2:])  # noqa: E731
    px = grid(seg.pad(inp.x, state.buffer["x"]))  # [B, S, L, H, P]
    pB = grid(seg.pad(inp.B, state.buffer["B"]))  # [B, S, L, G, N]
    pC = grid(seg.pad(inp.C, None))  # [B, S, L, G, N]
    pdt = grid(seg.pad(inp.dt, state.buffer["dt"]))  # [B, S, L, H]; padding dt = 0 decays by 1
    read_hi = grid(seg.read_hi)  # [B, S, L]

    cum = torch.cumsum(pdt * inp.A, dim=2)  # [B, S, L, H]: log G_{0..j}
    skip = config.skip_read_below
    hi, lo = state.hi, state.lo
    pre_image = hi.new_zeros(hi.shape, dtype=inp.x.dtype)  # FP32/64 state of each sequence's newest fold
    residual = state.residual  # error-feedback residuals ({copy: [B, H, P, N]}), and those before the newest fold
    pre_residual = {copy: torch.zeros_like(t) for copy, t in residual.items()}
    last_fold_seg = (seg.num_folds - 1).tolist()
    y_pad = torch.empty(batch, S, L, heads, head_dim, dtype=inp.x.dtype, device=inp.x.device)
    block = max(1, _BLOCK_ELEMENTS // max(1, batch * heads * head_dim * d_state))
    for s0 in range(0, S, block):
        blk = slice(s0, min(S, s0 + block))
        c, dtb = cum[:, blk], pdt[:, blk]  # [B, K, L, H]
        Bh = group_heads(pB[:, blk], heads)  # [B, K, L, H, N]
        Ch = group_heads(pC[:, blk], heads)
        # the states the block's segments add on top of their checkpoint: sum_i dt_i G_{i+1..L-1} x_i B_i^T
        weight = torch.exp(c[:, :, -1:] - c) * dtb  # [B, K, L, H]
        if config.buffer_dtype == "fp32":
            chunk_states = torch.einsum("bklhp,bklhn->bkhpn", weight[..., None] * px[:, blk], Bh)
        else:  # the scaled keys dt_i G_{i+1..L-1} B_i in the buffer dtype, as the reference's fold
            chunk_states = torch.einsum("bklhp,bklhn->bkhpn", px[:, blk], config.round_buffered(weight[..., None] * Bh))
        g_seg = torch.exp(c[:, :, -1])  # [B, K, H]
        if skip is not None:
            g_seg = torch.where(g_seg < skip, 0.0, g_seg)
        his, los = [], []
        for k, s in enumerate(range(blk.start, blk.stop)):
            his.append(hi)
            los.append(lo)
            fold = seg.folds_host[s]
            if not any(fold):
                continue
            folded = g_seg[:, k, :, None, None] * hi.to(inp.x.dtype) + chunk_states[:, k]
            new_residual = dict(residual)
            new_hi, new_lo = write_checkpoint(folded, config, state.layer, state.seq_ids, state.checkpoint + s + 1,
                                              new_residual)
            ends = [b for b, last in enumerate(last_fold_seg) if last == s]
            if ends:
                pre_image[ends] = folded[ends]
                for copy, t in residual.items():
                    pre_residual[copy][ends] = t[ends]
            if all(fold):
                hi, lo, residual = new_hi, new_lo, new_residual
            else:
                mask = seg.folds[:, s, None, None, None]
                hi, lo = torch.where(mask, new_hi, hi), torch.where(mask, new_lo, lo)
                residual = {copy: torch.where(mask, new_residual[copy], t) for copy, t in residual.items()}
        # outputs: G_{0..j} (S_src C_j) + sum_{i<=j} dt_i G_{i+1..j} (B_i . C_j) x_i
        his = torch.stack(his, 1).to(inp.x.dtype)  # [B, K, H, P, N]
        y_src = torch.einsum("bkhpn,bklhn->bklhp", his, Ch)
        if not config.shared:
            y_lo = torch.einsum("bkhpn,bklhn->bklhp", torch.stack(los, 1).to(inp.x.dtype), Ch)
            y_src = torch.where(read_hi[:, blk, :, None, None], y_src, y_lo)
        g_read = torch.exp(c)  # [B, K, L, H]
        if skip is not None:
            g_read = torch.where(g_read < skip, 0.0, g_read)
        ct = c.transpose(2, 3)  # [B, K, H, L]
        causal = torch.ones(L, L, dtype=torch.bool, device=c.device).tril()
        decay = torch.exp(torch.where(causal, ct[..., :, None] - ct[..., None, :], -torch.inf))  # [B, K, H, Lj, Li]
        scores = torch.einsum("bkjhn,bkihn->bkhji", Ch, Bh) * decay * dtb.transpose(2, 3)[..., None, :]
        y_pad[:, blk] = g_read[..., None] * y_src + torch.einsum("bkhji,bkihp->bkjhp", scores, px[:, blk])

    y = torch.gather(y_pad.view(batch, S * L, heads, head_dim), 1,
                     seg.index[..., None, None].expand(-1, -1, heads, head_dim))
    y = y + inp.D[:, None] * inp.x_skip

    folded_any = (seg.num_folds > 0).nonzero().flatten()
    packed = state.lo_packed
    if len(folded_any):
        rows = folded_any
        final_hi, final_lo, new_packed = write_checkpoint_packed(
            pre_image[rows], config, state.layer, state.seq_ids[rows], (state.checkpoint + seg.num_folds)[rows],
            {copy: t[rows] for copy, t in pre_residual.items()})
        packed = merge_packed(packed, new_packed, rows, batch)
    buffer = seg.new_buffers({"x": inp.x, "B": inp.B, "dt": inp.dt}, state.buffer, after.count)
    out = ReplayState(hi, hi if config.shared else lo, buffer, after, state.checkpoint + seg.num_folds,
                      state.seq_ids, state.layer, packed, residual)
    return y.to(inp.out_dtype), out

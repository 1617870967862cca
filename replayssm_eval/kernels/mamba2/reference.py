"""Step-by-step ReplaySSM decoding of a Mamba-2 layer in pure torch: the ground truth (docs/semantics.md, "Decode semantics").

`decode_reference` decodes one token at a time, batched over sequences, each with its own window
phase: append (x, B, dt) to the buffer, replay the buffer against the checkpoint copy the plan
names, and at a fold write a new checkpoint with `write_checkpoint`.
`speculative_decode_reference` simulates speculative decoding: a ring of L + T entries, T drafts
per step, output-only verification, commit by moving a pointer, and the early flush rule.
"""

from __future__ import annotations

import torch

from replayssm_eval.kernels.mamba2._common import Inputs, group_heads, merge_packed, parse_config, prepare_inputs
from replayssm_eval.replay.schedule import ScheduleState, accepted_per_step, plan_tokens
from replayssm_eval.replay.state import ReplayState, write_checkpoint_packed


def decode_reference(x, dt, A, B, C, D, initial_state, config, *, layer_idx=0, seq_ids=None,
                     compute_dtype=torch.float32):
    """Decode T tokens of a Mamba-2 layer step by step.

    x [B, T, H, P], dt [B, T, H] (after softplus and bias), A [H] (negative), B and C [B, T, G, N],
    D [H]; initial_state: the FP32 state [B, H, P, N] at the anchor (checkpoint 0 is written from
    it), or a ReplayState returned by a previous call. config: a ReplayConfig or its string form.
    Returns y [B, T, H, P] in x's dtype and the ReplayState after the last token.
    """
    inp = prepare_inputs(x, dt, A, B, C, D, initial_state, config, layer_idx, seq_ids, compute_dtype)
    batch, tokens, heads, _, _, _ = inp.dims
    state = inp.state
    plan, after = plan_tokens(inp.config, state.schedule, tokens, state.seq_ids)
    fold_rows = [row.nonzero().flatten() for row in plan.fold_after.t()]  # per token: sequences that fold

    run = _Run(inp)
    count = state.schedule.count.clone()
    rows = torch.arange(batch, device=inp.x.device)
    ys = []
    for n in range(tokens):
        run.append(rows, count, inp.x[:, n], inp.B[:, n], inp.dt[:, n])
        fold = fold_rows[n]
        y, folded = run.replay(count, inp.C[:, n], plan.read_hi[:, n], len(fold) > 0)
        ys.append(y + inp.D[:, None] * inp.x_skip[:, n])
        count += 1
        if len(fold):
            run.write(fold, folded[fold])
            count[fold] = 0
    y = torch.stack(ys, dim=1) if ys else inp.x.new_zeros(inp.x.shape)
    return y.to(inp.out_dtype), run.result(after)


def live_state(x, dt, A, B, C, D, state: ReplayState, config) -> torch.Tensor:
    """The state a flush now would fold from a carried ReplayState, unrounded: G S_hi + sum_i x_i (dt_i G_{i+1..} B_i)^T
    over its buffered entries (`_Run.replay`'s fold), [B, H, P, N] in the buffer's dtype. Of the inputs only A is read.
    The carried state is not checked again, so nothing here reads the device (the static step captures it in a
    graph)."""
    dtype = state.buffer["x"].dtype
    inp = Inputs(x, dt, A.to(dtype), B, C.to(dtype), D, x, state, parse_config(config), x.dtype)
    reads_hi = torch.ones(state.batch, dtype=torch.bool, device=state.hi.device)
    return _Run(inp).replay(state.schedule.count - 1, inp.C[:, 0], reads_hi, True)[1]


class _Run:
    """Checkpoints and buffer of a batch being decoded; the buffer is linear, entry i at index i."""

    def __init__(self, inp: Inputs):
        self.inp = inp
        state = inp.state
        self.hi, self.lo, self.packed = state.hi.clone(), state.lo.clone(), state.lo_packed
        self.residual = state.residual  # this call's own copies (`prepare_inputs`)
        self.checkpoint = state.checkpoint.clone()
        self.buffer = {k: v.clone() for k, v in state.buffer.items()}
        self.skip = inp.config.skip_read_below

    def append(self, rows, index, x, B, dt):
        """Write one entry per sequence at buffer index `index[b]` (rows: the sequences)."""
        self.buffer["x"][rows, index] = x
        self.buffer["B"][rows, index] = B
        self.buffer["dt"][rows, index] = dt

    def replay(self, last, C, read_hi, fold: bool):
        """Output S_src C and the folded state of entries 0..last[b], replayed newest first.

        y = G_{0..j} (S_src C) + sum_{i<=j} dt_i G_{i+1..j} (B_i . C) x_i, j = last[b];
        folded = G_{0..j} S_hi + sum_i x_i (dt_i G_{i+1..j} B_i)^T (None unless `fold`), the scaled keys
        rounded to the buffer dtype (`_fold_term`).
        """
        inp, buf = self.inp, self.buffer
        heads = inp.x.shape[2]
        Ch = group_heads(C, heads)  # [B, H, N]
        decay = torch.ones(Ch.shape[:2], dtype=Ch.dtype, device=Ch.device)  # [B, H], G_{i+1..j}
        acc_y = torch.zeros_like(buf["x"][:, 0])  # [B, H, P]
        acc_s = torch.zeros(*buf["x"][:, 0].shape, Ch.shape[-1], dtype=Ch.dtype, device=Ch.device) if fold else None
        for i in range(buf["x"].shape[1] - 1, -1, -1):
            active = (i <= last)[:, None]  # [B, 1]
            Bi = group_heads(buf["B"][:, i], heads)  # [B, H, N]
            coef = torch.where(active, decay * buf["dt"][:, i], 0.0)  # [B, H]
            acc_y = acc_y + (coef * (Bi * Ch).sum(-1))[..., None] * buf["x"][:, i]
            if fold:
                acc_s = acc_s + _fold_term(buf["x"][:, i], Bi, coef, inp.config)
            decay = torch.where(active, decay * torch.exp(buf["dt"][:, i] * inp.A), decay)
        if self.skip is not None:
            decay = torch.where(decay < self.skip, 0.0, decay)
        src = torch.where(read_hi[:, None, None, None], self.hi, self.lo).to(Ch.dtype)
        y = decay[..., None] * torch.einsum("bhpn,bhn->bhp", src, Ch) + acc_y
        folded = decay[..., None, None] * self.hi.to(Ch.dtype) + acc_s if fold else None
        return y, folded


    def write(self, rows, folded):
        """Write the next checkpoint of sequences `rows` from their FP32/FP64 folded states."""
        inp = self.inp
        self.checkpoint[rows] += 1
        residual = {copy: t[rows] for copy, t in self.residual.items()}
        hi, lo, packed = write_checkpoint_packed(folded, inp.config, inp.state.layer, inp.state.seq_ids[rows],
                                                 self.checkpoint[rows], residual)
        self.hi[rows], self.lo[rows] = hi, lo
        for copy, t in residual.items():
            self.residual[copy][rows] = t
        self.packed = merge_packed(self.packed, packed, rows, self.hi.shape[0])

    def result(self, schedule: ScheduleState) -> ReplayState:
        state = self.inp.state
        return ReplayState(self.hi, self.lo if not self.inp.config.shared else self.hi, self.buffer, schedule,
                           self.checkpoint, state.seq_ids, state.layer, self.packed, self.residual)


def _fold_term(x, B, coef, config) -> torch.Tensor:
    """coef x B^T of one buffer entry per sequence: x [..., H, P], B [..., H, N], coef [..., H] -> [..., H, P, N].

    With a buffer dtype the scaled key coef B (dt_i G_{i+1..j} B_i) is rounded to it before the product, as vLLM's
    fold casts `B * dt * decay` to the activation dtype before its dot (docs/engine_numerics.md).
    """
    if config.buffer_dtype == "fp32":
        return coef[..., None, None] * x[..., None] * B[..., None, :]
    return x[..., None] * config.round_buffered(coef[..., None] * B)[..., None, :]


def speculative_decode_reference(x, dt, A, B, C, D, initial_state, config, *, layer_idx=0, seq_ids=None,
                                 compute_dtype=torch.float32, draft_seed=0):
    """Simulate speculative decoding of the committed token stream (config.speculative must be set).

    Every step writes T draft entries into a ring of capacity L + T after the h committed ones:
    the first c are the next true tokens (c from `schedule.accepted_per_step`), the rest junk
    drawn from `draft_seed` (rejected drafts; they must not change any committed output). The
    step verifies all T drafts at once, output only,
        O = G_ckpt (S_src C^T) + V (W (.) (K^T Q)),
    with Q = C of the drafts, K = B and V = dt x of the h + T ring entries, G_ckpt the cumulative
    decays of the draft positions since the checkpoint and W the causal decay mask, keeps the
    outputs of the c committed drafts, and commits them by moving the pointer h += c. After a
    step, if h + T > L, the h committed entries are folded into S_hi and a checkpoint is written
    (early flush), and the next step reads S_hi; otherwise it reads S_lo.
    A call may end inside a step; the rest of the step is consumed by the next call.
    Returns y [B, T, H, P] (committed outputs) and the ReplayState, as `decode_reference`.
    """
    inp = prepare_inputs(x, dt, A, B, C, D, initial_state, config, layer_idx, seq_ids, compute_dtype)
    spec = inp.config.speculative
    if spec is None:
        raise ValueError(f"config {inp.config.name!r} has no speculative schedule; expected e.g. '...#spec=4:0.7'")
    batch, tokens, heads, head_dim, groups, d_state = inp.dims
    drafts, window, capacity = spec.drafts, inp.config.window, inp.capacity
    state = inp.state
    device = inp.x.device
    gen = torch.Generator(device="cpu").manual_seed(draft_seed)
    run = _Run(inp)
    ring_start = [0] * batch  # the buffer of a ReplayState is linear: entry i at ring index i
    count, left, read_hi, steps = (t.tolist() for t in (state.schedule.count, state.schedule.step_left,
                                                         state.schedule.step_read_hi, state.schedule.steps))
    y = inp.x.new_zeros(inp.x.shape)
    for b in range(batch):
        n = 0
        while n < tokens:
            if left[b] == 0:
                left[b] = accepted_per_step(inp.config.seed, int(state.seq_ids[b]), steps[b], drafts, spec.accept)
                steps[b] += 1
            take = min(left[b], tokens - n)
            # the step's draft inputs: `take` true tokens, then junk
            junk = lambda *shape: torch.randn(*shape, generator=gen, dtype=inp.x.dtype).to(device)  # noqa: E731
            dx = torch.cat([inp.x[b, n:n + take], junk(drafts - take, heads, head_dim)])
            dB = torch.cat([inp.B[b, n:n + take], junk(drafts - take, groups, d_state)])
            dC = torch.cat([inp.C[b, n:n + take], junk(drafts - take, groups, d_state)])
            ddt = torch.cat([inp.dt[b, n:n + take], junk(drafts - take, heads).abs()])
            ring = (ring_start[b] + count[b] + torch.arange(drafts, device=device)) % capacity
            for key, value in (("x", dx), ("B", dB), ("dt", ddt)):
                run.buffer[key][b, ring] = value
            out = _verify(run, b, ring_start[b], count[b], dC, read_hi[b])  # [T, H, P]
            y[b, n:n + take] = out[:take] + inp.D[:, None] * inp.x_skip[b, n:n + take]
            count[b] += take
            left[b] -= take
            n += take
            if left[b] == 0:  # step end: early flush if the next step might overflow the window
                read_hi[b] = count[b] + drafts > window
                if read_hi[b]:
                    _flush(run, b, ring_start[b], count[b])
                    ring_start[b] = (ring_start[b] + count[b]) % capacity
                    count[b] = 0
    for key, value in run.buffer.items():  # linearise the ring for the returned state
        run.buffer[key] = torch.stack([value[b].roll(-ring_start[b], dims=0) for b in range(batch)])
    as_tensor = lambda v, dtype: torch.tensor(v, dtype=dtype, device=device)  # noqa: E731
    schedule = ScheduleState(as_tensor(count, torch.int64), as_tensor(left, torch.int64),
                             as_tensor(read_hi, torch.bool), as_tensor(steps, torch.int64))
    return y.to(inp.out_dtype), run.result(schedule)


def _ring_entries(run: _Run, b: int, start: int, length: int):
    """Ring entries start..start+length-1 of sequence b in logical order, heads expanded: x, B, dt, log decay."""
    index = (start + torch.arange(length, device=run.hi.device)) % run.buffer["x"].shape[1]
    heads = run.buffer["x"].shape[2]
    dt = run.buffer["dt"][b, index]  # [E, H]
    return run.buffer["x"][b, index], group_heads(run.buffer["B"][b, index], heads), dt, dt * run.inp.A


def _verify(run: _Run, b: int, start: int, committed: int, C_drafts, read_hi: bool):
    """Outputs (without D x) of the drafts at ring offsets committed..committed+T-1, from the checkpoint and the ring."""
    drafts = C_drafts.shape[0]
    x, K, dt, log_a = _ring_entries(run, b, start, committed + drafts)  # [E, H, P], [E, H, N], [E, H]
    Q = group_heads(C_drafts, x.shape[1])  # [T, H, N]
    cum = log_a.cumsum(0)  # [E, H]: log G_{0..e}
    rows = committed + torch.arange(drafts, device=x.device)  # ring offsets of the drafts
    g_ckpt = torch.exp(cum[rows])  # [T, H]
    if run.skip is not None:
        g_ckpt = torch.where(g_ckpt < run.skip, 0.0, g_ckpt)
    causal = torch.arange(x.shape[0], device=x.device)[:, None] <= rows[None, :]  # [E, T]
    W = torch.exp(torch.where(causal[..., None], cum[rows][None] - cum[:, None], -torch.inf))  # [E, T, H]
    src = (run.hi if read_hi else run.lo)[b].to(Q.dtype)  # [H, P, N]
    inter = g_ckpt[..., None] * torch.einsum("hpn,thn->thp", src, Q)
    scores = W * torch.einsum("ehn,thn->eth", K, Q)  # W (.) (K^T Q)
    intra = torch.einsum("eth,ehp->thp", scores, dt[..., None] * x)  # V (W (.) K^T Q)
    return inter + intra


def _flush(run: _Run, b: int, start: int, committed: int):
    """Fold the `committed` ring entries of sequence b into S_hi and write the next checkpoint."""
    x, K, dt, log_a = _ring_entries(run, b, start, committed)
    cum = log_a.cumsum(0)  # [h, H]
    g_total = torch.exp(cum[-1])  # [H]
    if run.skip is not None:
        g_total = torch.where(g_total < run.skip, 0.0, g_total)
    weight = torch.exp(cum[-1][None] - cum) * dt  # [h, H]: dt_i G_{i+1..h-1}
    config = run.inp.config
    if config.buffer_dtype == "fp32":
        update = torch.einsum("eh,ehp,ehn->hpn", weight, x, K)
    else:  # the scaled keys rounded to the buffer dtype, as `_fold_term`
        update = torch.einsum("ehp,ehn->hpn", x, config.round_buffered(weight[..., None] * K))
    folded = g_total[:, None, None] * run.hi[b].to(x.dtype) + update
    run.write(torch.tensor([b], device=x.device), folded[None])

"""Mamba-2 test inputs, token slicing, phased batches and the naive recurrence the reference is checked against.

The naive decoder keeps, per sequence, the unrounded state accumulated since the newest checkpoint
(R = sum dt_i G x_i B_i^T, a recurrence) and the window phase j = n mod L itself; it shares nothing
with the reference but `write_checkpoint` (the formats are the formats library's).
"""

import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.state import write_checkpoint

from tests.helpers.replay import stack_states


def mamba2_inputs(batch=3, tokens=37, heads=3, head_dim=20, groups=3, d_state=24, dtype=torch.float64, seed=0,
                slow_heads=True):
    """Random Mamba-2 inputs; with slow_heads some heads decay slowly (the ones where errors accumulate)."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    x = rand(batch, tokens, heads, head_dim)
    dt = torch.nn.functional.softplus(rand(batch, tokens, heads) - 1.0)  # [B, T, H]
    A = -torch.exp(rand(heads))  # [H]
    if slow_heads:
        A[0] = -0.02
    B, C = rand(batch, tokens, groups, d_state), rand(batch, tokens, groups, d_state)
    D = rand(heads)
    state = 3.0 * torch.randn(batch, heads, head_dim, d_state, generator=gen)  # FP32 at the anchor
    return x, dt, A, B, C, D, state


def sliced(inputs, start, stop):
    """Tokens [start, stop) of mamba2_inputs' per-token tensors (A, D and the state unchanged)."""
    x, dt, A, B, C, D, state = inputs
    return x[:, start:stop], dt[:, start:stop], A, B[:, start:stop], C[:, start:stop], D, state


def phased_state(fn, inputs, config, pre, compute_dtype=torch.float64):
    """Decode pre[b] tokens of sequence b alone with `fn` and stack the results: sequences at different phases."""
    x, dt, A, B, C, D, state = inputs
    parts = []
    for b, n in enumerate(pre):
        one = lambda t: t[b:b + 1, :n]  # noqa: E731
        _, st = fn(one(x), one(dt), A, one(B), one(C), D, state[b:b + 1], config, seq_ids=[b],
                   compute_dtype=compute_dtype)
        parts.append(st)
    return stack_states(parts)


def naive_mamba2_decode(inputs, config: ReplayConfig, seq: int, layer=0):
    """One sequence from its anchor, token by token, in FP64 with the recurrence form; returns y [T, H, P] and (S_hi, S_lo)."""
    x, dt, A, B, C, D, state = (t.double() for t in inputs)
    x, dt, B, C = x[seq], dt[seq], B[seq], C[seq]
    heads, groups = x.shape[1], B.shape[1]
    ids = torch.tensor([seq])
    hi, lo = write_checkpoint(state[seq:seq + 1].float(), config, layer, ids, torch.tensor([0]))
    R = torch.zeros_like(state[seq])  # [H, P, N]
    g = torch.ones(heads, dtype=torch.float64)
    checkpoint, ys = 0, []
    for t in range(x.shape[0]):
        Bh = B[t].repeat_interleave(heads // groups, 0)  # [H, N]
        Ch = C[t].repeat_interleave(heads // groups, 0)
        a = torch.exp(dt[t] * A)  # [H]
        R = a[:, None, None] * R + dt[t][:, None, None] * x[t][:, :, None] * Bh[:, None, :]
        g = a * g
        gk = g if config.skip_read_below is None else torch.where(g < config.skip_read_below, 0.0, g)
        flush = t % config.window == config.window - 1
        src = (hi if flush else lo)[0].double()
        S = gk[:, None, None] * src + R
        ys.append((S * Ch[:, None, :]).sum(-1) + D[:, None] * x[t])
        if flush:
            checkpoint += 1
            hi, lo = write_checkpoint(S[None], config, layer, ids, torch.tensor([checkpoint]))
            R, g = torch.zeros_like(R), torch.ones_like(g)
    return torch.stack(ys), (hi[0], lo[0])

"""Delta-rule (GDN, KDA) test inputs, token slicing, phased batches and the naive recurrences the references are
checked against.

The naive decoder keeps, per sequence, S_hi, S_lo and a Python list of buffered entries, rebuilds
S_{t-1} by running the recursion S <- A S + k u^T over the list (A = exp(g), a scalar for GDN,
diag(exp(g)) for KDA; the reference uses closed-form cumulative decays instead), and finds flushes
from its own counter. `plain_recurrence` is the exact recurrence as HF's recurrent loop.
"""

import torch

from replayssm_eval.kernels import gdn, kda
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.state import write_checkpoint

from tests.helpers.replay import WINDOWS, stack_states

FAMILIES = {"gdn": gdn, "kda": kda}
DV = {"gdn": 24, "kda": 12}  # default value head size of `delta_inputs`
WARMUP = (0, 3, 6)  # tokens decoded per sequence before the batched call: per-sequence window phases
MATRIX = [(w, f) for w in WINDOWS for f in ("open", "closed") if (w, f) != (1, "closed")]  # L = 1: open == closed


def delta_inputs(fam="gdn", batch=3, seqlen=37, heads=2, value_heads=4, dk=20, dv=None, dtype=torch.float64, seed=0,
                 device="cpu", decay=0.25):
    """q, k L2-normalised (q scaled by K^-0.5) as the HF layer passes them, g <= 0, beta in (0, 1), S0 on the FP32 grid.

    Heads decay at rates from slow to `decay`; with KDA's per-channel g [B, T, HV, K] each channel at 1/2 to 1 times
    its head's rate."""
    dv = DV[fam] if dv is None else dv
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q = torch.nn.functional.normalize(rand(batch, seqlen, heads, dk), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(rand(batch, seqlen, heads, dk), dim=-1)
    v = rand(batch, seqlen, value_heads, dv)
    rate = torch.linspace(0.01, decay, value_heads, dtype=torch.float64)  # per-head rates: some slow heads, some fast
    if fam == "kda":
        rate = rate[:, None] * (0.5 + 0.5 * torch.rand(value_heads, dk, generator=gen, dtype=torch.float64))
        g = -rate * torch.rand(batch, seqlen, value_heads, dk, generator=gen, dtype=torch.float64) * 2
    else:
        g = -rate * torch.rand(batch, seqlen, value_heads, generator=gen, dtype=torch.float64) * 2
    beta = torch.rand(batch, seqlen, value_heads, generator=gen, dtype=torch.float64)
    s0 = rand(batch, value_heads, dk, dv).float().double()
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, g, beta, s0)]


def square_kda_inputs(seqlen, size=16, dtype=torch.float64, device="cpu"):
    """KDA inputs with K = V = size, as a real KDA model has them, and per-channel decays 40x apart (up to 0.05 to 2
    per token), so a decay applied along V instead of K gives other numbers rather than a shape error."""
    q, k, v, g, beta, s0 = delta_inputs("kda", batch=2, seqlen=seqlen, heads=1, value_heads=2, dk=size, dv=size)
    spread = torch.logspace(-1.3, 0.3, size, dtype=torch.float64)  # [K], 0.05 ... 2
    g = -spread * torch.rand(g.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)  # [B, T, HV, K]
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, g, beta, s0)]


def one_column_share(inputs) -> float:
    """The flip budget of a delta-rule comparison of two FP32 paths: the share of the elements of o, u or S that one
    flipped rounding can move. The delta rule never mixes value columns (u_j, o_j and column j of S [K, V] read only
    column j of S; a row-scaled copy's scale covers one column), so a rounding that FP32 summation noise puts on the
    other side of a boundary moves one column of one (row, head) from then on: 1 / (B x HV x V) of the elements."""
    v = inputs[2]  # [B, T, HV, V]
    return 1 / (v.shape[0] * v.shape[2] * v.shape[3])


def cut(inputs, start, stop=None, rows=None):
    """Tokens [start, stop) (and batch rows) of (q, k, v, g, beta)."""
    out = [t[:, start:stop] for t in inputs[:5]]
    return out if rows is None else [t[rows] for t in out]


def phased_start(fam, inputs, config, warmup=WARMUP, decode=None, dtype=torch.float64):
    """Decode `warmup[b]` tokens of sequence b alone (seq id b), then stack: a batch with differing phases."""
    decode = decode or FAMILIES[fam].decode_reference
    states = []
    for b, w in enumerate(warmup):
        one = [t[b:b + 1, :w] for t in inputs[:5]]
        _, st = decode(*one, inputs[5][b:b + 1], config, seq_ids=torch.tensor([b], device=inputs[0].device), compute_dtype=dtype)
        states.append(st)
    return stack_states(states)


def naive_delta_decode(inputs, config, seq_id, layer=0):
    """One sequence (inputs without the batch dim), fixed window, every token from the anchor: plain loops.

    g: [T, HV] (GDN) or [T, HV, K] (KDA). Returns (o [T, HV, V], S_hi, S_lo [HV, K, V])."""
    cfg = ReplayConfig.parse(config) if isinstance(config, str) else config
    q, k, v, g, beta, s0 = (t.double() for t in inputs)
    groups = v.shape[1] // q.shape[1]
    seq = torch.tensor([seq_id])

    def store(state, index):
        hi, lo = write_checkpoint(state.transpose(-1, -2)[None], cfg, layer, seq, torch.tensor([index]))
        return hi[0].transpose(-1, -2).double(), lo[0].transpose(-1, -2).double()

    def rows(decay):  # a scalar decay, or a per-channel one scaling the rows of S
        return decay[:, None] if decay.dim() else decay

    def skipped(decay):  # every channel's cumulative decay below eps
        return cfg.skip_read_below is not None and bool((decay < cfg.skip_read_below).all())

    s_hi, s_lo = store(s0, 0)
    entries, outs, ckpt = [], [], 0
    for t in range(q.shape[0]):
        flush = len(entries) == cfg.window - 1
        out_t = torch.empty(v.shape[1:], dtype=torch.float64)
        new = []
        for h in range(v.shape[1]):
            kh, qh = k[t, h // groups], q[t, h // groups]
            decay = torch.exp(sum(e["g"][h] for e in entries) + g[t, h])  # cumulative since the checkpoint
            read = s_hi[h] if flush else s_lo[h]
            s = torch.zeros_like(read) if skipped(decay) else read.clone()
            for e in entries:  # S_{t-1}, rebuilt by recursion
                s = rows(torch.exp(e["g"][h])) * s + torch.outer(e["k"][h // groups], e["u"][h])
            s = rows(torch.exp(g[t, h])) * s
            u = beta[t, h] * (v[t, h] - s.T @ kh)
            out_t[h] = (s + torch.outer(kh, u)).T @ qh
            new.append(u)
        entries.append(dict(k=k[t], u=torch.stack(new), g=g[t], v=v[t], beta=beta[t]))
        if flush:
            folded = torch.empty_like(s_hi)
            for h in range(v.shape[1]):
                decay = torch.exp(sum(e["g"][h] for e in entries))
                s = torch.zeros_like(s_hi[h]) if skipped(decay) else s_hi[h].clone()
                for e in entries:
                    kh = e["k"][h // groups]
                    s = rows(torch.exp(e["g"][h])) * s
                    if cfg.gdn_fold == "open":
                        s = s + torch.outer(kh, e["u"][h])
                    else:  # exact delta rule from S_hi
                        s = s + torch.outer(kh, e["beta"][h] * (e["v"][h] - s.T @ kh))
                folded[h] = s
                if cfg.gdn_fold == "closed":
                    out_t[h] = s.T @ q[t, h // groups]
            ckpt += 1
            s_hi, s_lo = store(folded, ckpt)
            entries = []
        outs.append(out_t)
    return torch.stack(outs), s_hi, s_lo


def plain_recurrence(inputs, round_every=None, config=None, layer=0):
    """The exact recurrence over all sequences, written as HF's recurrent loop (per-channel g [B, T, HV, K] or
    scalar g [B, T, HV]); optionally rounding the state via write_checkpoint every n tokens."""
    q, k, v, g, beta, state = (t.double() for t in inputs)
    groups = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(groups, 2), k.repeat_interleave(groups, 2)
    seq = torch.arange(q.shape[0])
    outs, index = [], 0
    if round_every:  # the prefill checkpoint
        hi, _ = write_checkpoint(state.transpose(-1, -2), config, layer, seq, torch.zeros_like(seq))
        state = hi.transpose(-1, -2).double()
    for t in range(q.shape[1]):
        decay = g[:, t].exp()
        state = state * (decay[..., None] if g.dim() == 4 else decay[..., None, None])
        delta = (v[:, t] - (state * k[:, t, ..., None]).sum(-2)) * beta[:, t, :, None]
        state = state + k[:, t, ..., None] * delta[..., None, :]
        outs.append((state * q[:, t, ..., None]).sum(-2))
        if round_every and (t + 1) % round_every == 0:
            index += 1
            hi, _ = write_checkpoint(state.transpose(-1, -2), config, layer, seq, torch.full_like(seq, index))
            state = hi.transpose(-1, -2).double()
    return torch.stack(outs, 1), state

"""Teacher-forced ReplaySSM delta rule (GDN, KDA): parallel inside each segment, sequential between checkpoints.

A segment is the run of buffer entries between two checkpoints (the first segment of a call
starts with the entries carried in the ReplayState's buffer; they keep their stored u). Inside a
segment, with gc_t the log of the decay from the checkpoint through entry t and d_t = exp(gc_t)
(0 where `skip_read_below` drops the checkpoint term), the delta rule of `reference.py` reads

    u_t + beta_t sum_{i<t} exp(gc_t - gc_i) (k_t . k_i) u_i = beta_t (v_t - d_t S_src(t)^T k_t)

a unit-lower-triangular system (WY / UT form). Tokens reading S_hi and tokens reading S_lo only
differ in their right-hand side, so with T = (I + A)^-1 every u of the segment is

    U = T beta V - (T R_hi) S_hi - (T R_lo) S_lo        R_x: rows beta_t d_t k_t^T of tokens reading x
    O = (d Q)_hi S_hi + (d Q)_lo S_lo + (M (.) Q K^T) U  M: causal decays exp(gc_t - gc_i), i <= t
    S_fold = d_end S_hi + sum_i exp(gc_end - gc_i) k_i u_i^T                           (open fold)

and a closed fold solves the same system with every row reading S_hi and every entry's u
recomputed from its raw (v, beta). With KDA's per-channel decay, gc_t [K] and the pairwise decays
P_ti = exp(gc_t - gc_i) [K] (i <= t) replace the scalar ones: k_t . P_ti k_i in A, R_x rows
beta_t (d_t k_t)^T, M_ti = q_t . P_ti k_i, S_fold = diag(d_end) S_hi + sum_i (P_end,i k_i) u_i^T.
The pairwise decays are formed per channel ([L, L, K]) rather than factored as
exp(gc_t) exp(-gc_i), which overflows for strongly decaying channels. Everything that does not
depend on the checkpoint (T, the W = T R, M; `precompute`, also the input of KDA's Triton kernel)
is computed for a block of segments at once; the loop over segments only applies the checkpoint
(a few batched matmuls) and `write_checkpoint`, all sequences together whatever their phase
(sequences with fewer segments carry padding that changes nothing).

With a buffer dtype (`#buf=bf16|fp16`) each u_i is rounded to it when buffered, before later entries use it,
so the system has no joint solution: `forward_substitution` solves it one row at a time, per segment once its
checkpoint is known, the rows of the sum using the rounded u_i. A token's own u_t enters its output as computed,
the fold and the buffer take the rounded u's (`reference.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm_eval.kernels.delta._common import (
    Prepared, buffer_keys, empty_buffer, from_format_layout, keep_checkpoint, to_format_layout,
)
from replayssm_eval.replay.state import ReplayState, write_checkpoint

BLOCK_ELEMENTS = 1 << 26  # budget for one block of precomputed segment tensors, in elements


@dataclass
class Segments:
    """Where every token and carried buffer entry sits in the padded [B, NS, L] segment grid."""

    num: int  # NS: segments (max over sequences)
    length: int  # L: padded segment length
    tok_index: torch.Tensor  # [B, T] flat index into [B * NS * L] of each token
    pre_index: torch.Tensor  # [B, capacity] flat index of each buffer slot's entry; B * NS * L past the carried ones
    folds: torch.Tensor  # [B, NS] bool, segment s of sequence b ends with a fold
    last: torch.Tensor  # [B, NS] int64, position of the segment's last entry (the fold token), -1 if empty
    count_after: torch.Tensor  # [B] entries left in the buffer after the call


def segment_layout(p: Prepared) -> Segments:
    fold = p.plan.fold_after  # [B, T]
    bsz, seqlen = fold.shape
    device = fold.device
    count0 = p.state.schedule.count.to(device)
    n = torch.arange(seqlen, device=device).expand(bsz, seqlen)
    seg = p.plan.anchor  # [B, T]
    last_fold = torch.where(fold, n, -1).cummax(dim=1).values
    last_fold = torch.cat([torch.full((bsz, 1), -1, device=device, dtype=torch.int64), last_fold[:, :-1]], dim=1)
    pos = torch.where(seg > 0, n - last_fold - 1, count0[:, None] + n)  # [B, T]
    nfold = p.plan.num_folds  # [B]
    shape = p.plan.shape
    if shape is not None:  # the host knows the schedule: no device read
        num, length = max(shape.num_folds, default=0) + 1, max(shape.longest, *shape.counts, 1)
    elif seqlen:  # the call's one host read
        num, length = torch.stack([nfold.max() + 1, torch.maximum(pos.max() + 1, count0.max())]).tolist()
    else:
        num, length = 1, int(count0.max()) if count0.numel() else 0
    length = max(length, 1)
    tok_index = (torch.arange(bsz, device=device)[:, None] * num + seg) * length + pos
    slot = torch.arange(p.capacity, device=device)
    pre_index = torch.where(slot[None, :] < count0[:, None], (torch.arange(bsz, device=device)[:, None] * num) * length
                            + slot, bsz * num * length)  # [B, capacity]
    seg_ids = torch.arange(num, device=device)
    folds = seg_ids[None, :] < nfold[:, None]
    # entries per segment: tokens plus, for segment 0, the carried ones
    sizes = torch.zeros(bsz * num, dtype=torch.int64, device=device)
    sizes.index_add_(0, (torch.arange(bsz, device=device)[:, None] * num + seg).flatten(), torch.ones_like(seg).flatten())
    sizes = sizes.view(bsz, num)
    sizes[:, 0] += count0
    count_after = sizes.gather(1, nfold[:, None]).squeeze(1)
    return Segments(num, length, tok_index, pre_index, folds, sizes - 1, count_after)


def pad_segments(seg: Segments, x_tok: torch.Tensor, x_buf: torch.Tensor | None) -> torch.Tensor:
    """Tokens [B, T, ...] (and carried entries [B, cap, ...], zeros where None) -> zero-padded [B, NS, L, ...], by one
    gather (GDN's Triton chunked form pads its inputs at once, concatenated along their last dim)."""
    bsz, seqlen = x_tok.shape[:2]
    cap = seg.pre_index.shape[1]
    size = bsz * seg.num * seg.length
    device = x_tok.device
    source = torch.full((size + 1,), bsz * (seqlen + cap), device=device)  # [B * NS * L + dump]: the zero row
    source[seg.tok_index.flatten()] = torch.arange(bsz * seqlen, device=device)
    source[seg.pre_index.flatten()] = bsz * seqlen + torch.arange(bsz * cap, device=device)
    carried = x_tok.new_zeros(bsz * cap, *x_tok.shape[2:]) if x_buf is None else x_buf[:, :cap].flatten(0, 1)
    rows = torch.cat([x_tok.flatten(0, 1), carried.to(x_tok.dtype), x_tok.new_zeros(1, *x_tok.shape[2:])])
    return rows[source[:size]].view(bsz, seg.num, seg.length, *x_tok.shape[2:])


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """[B, NS, L, HV, ...] -> [B, NS, HV, L, ...]."""
    return x.transpose(2, 3)


def padded_inputs(p: Prepared, seg: Segments) -> dict[str, torch.Tensor]:
    """Tokens and carried entries on the segment grid, heads first: k, q [B, NS, HV, L, K]; g [B, NS, HV, L(, K)];
    v, u_known [B, NS, HV, L, V]; beta [B, NS, HV, L]; pre (carried entry, u known), read_hi [B, NS, L] bool."""
    bsz, seqlen = p.q.shape[:2]
    buf = p.state.buffer
    expand = lambda t: t.repeat_interleave(p.groups, dim=2) if p.groups > 1 else t  # noqa: E731  [B, cap, H, K] -> HV
    return {
        "k": _heads_first(pad_segments(seg, p.k, expand(buf["k"]))),
        "q": _heads_first(pad_segments(seg, p.q, None)),
        "g": _heads_first(pad_segments(seg, p.g, buf["g"])),
        "v": _heads_first(pad_segments(seg, p.v, buf.get("v"))),
        "beta": pad_segments(seg, p.beta, buf.get("beta")).transpose(2, 3),
        "u_known": _heads_first(pad_segments(seg, torch.zeros_like(p.v), buf["u"])),
        "pre": pad_segments(seg, torch.zeros(bsz, seqlen, dtype=torch.bool, device=p.q.device),
                    torch.ones_like(buf["u"][..., 0, 0], dtype=torch.bool)),
        "read_hi": pad_segments(seg, p.plan.read_hi, None),
    }


def block_size(seg: Segments, bsz: int, nv: int, dk: int, dv: int, per_channel: bool) -> int:
    """Segments per precompute block (per channel, the [L, L, K] pairwise decays dominate)."""
    per_segment = bsz * nv * seg.length * (3 * dk + 4 * dv + 3 * seg.length + (seg.length * dk if per_channel else 0))
    return max(1, min(seg.num, BLOCK_ELEMENTS // max(per_segment, 1)))


def chunked_torch(p: Prepared) -> tuple[torch.Tensor, ReplayState]:
    """backend="torch" of `chunked`: o [B, T, HV, V] in the compute dtype and the ReplayState after the call."""
    cfg, st, cd = p.config, p.state, p.dtype
    bsz, seqlen, nv, dk = p.q.shape
    dv = p.v.shape[-1]
    closed = cfg.gdn_fold == "closed"
    seg = segment_layout(p)
    substitute = cfg.buffer_dtype != "fp32"  # each u rounded before the later ones use it: no joint solve
    x = padded_inputs(p, seg)
    hi32, lo32 = st.hi, st.lo
    s_hi, s_lo = from_format_layout(hi32).to(cd), from_format_layout(lo32).to(cd)  # [B, HV, K, V]
    ckpt = st.checkpoint.clone()
    u_all = torch.empty(bsz, seg.num, nv, seg.length, dv, dtype=cd, device=p.q.device)
    o_all = torch.empty_like(u_all)
    block = block_size(seg, bsz, nv, dk, dv, p.per_channel)
    rows = torch.arange(bsz, device=p.q.device)

    for start in range(0, seg.num, block):
        sl = slice(start, min(start + block, seg.num))
        blk = precompute({name: t[:, sl] for name, t in x.items()}, cfg.skip_read_below, closed, p.per_channel, substitute)
        for j, s in enumerate(range(sl.start, sl.stop)):
            at = {name: t[:, j] for name, t in blk.items()}
            o = at["q_hi"] @ s_hi + at["q_lo"] @ s_lo
            if substitute:
                r = at["r_v"] - at["r_hi"] @ s_hi - at["r_lo"] @ s_lo  # [B, HV, L, V]
                u_raw, u = forward_substitution(at["a"], r, cfg.round_buffered)
                # a token's own u enters its output as computed, the earlier entries' as buffered
                o = o + at["m"] @ u + torch.diagonal(at["m"], dim1=-2, dim2=-1)[..., None] * (u_raw - u)
            else:
                u = at["u0"] - at["w_hi"] @ s_hi - at["w_lo"] @ s_lo  # [B, HV, L, V]
                o = o + at["m"] @ u
            folded = seg.folds[:, s]
            if folded.any():
                if closed:
                    u_c = at["u0_c"] - at["w_c"] @ s_hi
                    state = at["d_end"][..., None] * s_hi + at["k_end"].transpose(-1, -2) @ u_c
                    last = seg.last[:, s].clamp(min=0)
                    q_last = x["q"][rows, s, :, last]  # [B, HV, K]
                    o_fold = torch.einsum("bhkv,bhk->bhv", state, q_last)
                    take = (folded & x["read_hi"][rows, s, last]).nonzero().flatten()
                    o[take, :, last[take]] = o_fold[take]
                else:
                    state = at["d_end"][..., None] * s_hi + at["k_end"].transpose(-1, -2) @ u
                idx = folded.nonzero().flatten()
                residual = {copy: t[idx] for copy, t in st.residual.items()}
                new_hi, new_lo = write_checkpoint(to_format_layout(state[idx]).contiguous(), cfg, p.layer, p.seq_ids[idx],
                                                  ckpt[idx] + 1, residual)
                for copy, t in residual.items():
                    st.residual[copy][idx] = t
                hi32 = hi32.clone()
                hi32[idx] = new_hi
                if cfg.shared:
                    lo32 = hi32
                else:
                    lo32 = lo32.clone()
                    lo32[idx] = new_lo
                s_hi, s_lo = s_hi.clone(), s_lo.clone()
                s_hi[idx], s_lo[idx] = from_format_layout(new_hi).to(cd), from_format_layout(new_lo).to(cd)
                ckpt[idx] += 1
            u_all[:, s], o_all[:, s] = u, o

    o_tok = o_all.transpose(2, 3).reshape(bsz * seg.num * seg.length, nv, dv)[seg.tok_index.flatten()]
    return o_tok.view(bsz, seqlen, nv, dv), state_after(p, seg, hi32, lo32, ckpt, u_all.transpose(2, 3))


def state_after(p: Prepared, seg: Segments, hi32, lo32, ckpt, u_seg) -> ReplayState:
    """The ReplayState after the call; its buffer holds the entries of each sequence's last (unfolded) segment.

    u_seg: [B, NS, L, HV, V] the u of every segment entry.
    """
    st, cfg = p.state, p.config
    bsz, nv, dk, dv = p.q.shape[0], p.q.shape[2], p.q.shape[3], p.v.shape[-1]
    rows = torch.arange(bsz, device=p.q.device)
    last_seg = p.plan.num_folds
    new_buf = empty_buffer(buffer_keys(cfg), bsz, p.capacity, st.buffer["k"].shape[2], nv, dk, dv, p.q.device, p.dtype,
                           p.per_channel)
    sources = {
        "k": lambda: pad_segments(seg, p.k_heads, st.buffer["k"]), "u": lambda: u_seg, "g": lambda: pad_segments(seg, p.g, st.buffer["g"]),
        "v": lambda: pad_segments(seg, p.v, st.buffer.get("v")), "beta": lambda: pad_segments(seg, p.beta, st.buffer.get("beta")),
    }
    keep = torch.arange(seg.length, device=p.q.device)[None, :] < seg.count_after[:, None]  # [B, L]
    for name, t in new_buf.items():
        entries = sources[name]()[rows, last_seg].to(p.dtype)  # [B, L, ...]
        mask = keep.view(bsz, seg.length, *([1] * (entries.dim() - 2)))
        t[:, : seg.length] = torch.where(mask, entries, torch.zeros_like(entries))
    return ReplayState(
        hi=hi32, lo=lo32, buffer=new_buf, schedule=p.schedule_after, checkpoint=ckpt, seq_ids=p.seq_ids, layer=p.layer,
        residual=st.residual,
    )


def forward_substitution(a, r, rounded):
    """u_t = r_t - sum_{i<t} a[t, i] rounded(u_i), in order: the delta rule of a segment whose buffered u's are rounded.

    a: [..., L, L] strictly lower; r: [..., L, V]. Returns (u, rounded(u)), each [..., L, V].
    """
    u, u_buf = torch.empty_like(r), torch.empty_like(r)
    for t in range(r.shape[-2]):
        u[..., t, :] = r[..., t, :] - (a[..., t:t + 1, :t] @ u_buf[..., :t, :])[..., 0, :]
        u_buf[..., t, :] = rounded(u[..., t, :])
    return u, u_buf


def precompute(x: dict[str, torch.Tensor], eps, closed, per_channel, substitute=False) -> dict[str, torch.Tensor]:
    """Checkpoint-independent tensors of a block of segments (`padded_inputs` sliced to S segments).

    Returns u0, w_hi, w_lo ([B, S, HV, L, V], [.., L, K] x 2): U = u0 - w_hi S_hi - w_lo S_lo; q_hi, q_lo
    [.., L, K] and m [.., L, L]: O = q_hi S_hi + q_lo S_lo + m U; d_end [B, S, HV, K] (scalar decay: [B, S, HV, 1]),
    k_end [.., L, K]: the open fold; closed: u0_c, w_c (every row from S_hi, u from the raw entries).
    substitute (a buffer dtype): the open system (I + A) U = R unsolved instead, r_v, r_hi, r_lo in place of u0,
    w_hi, w_lo and a [.., L, L] (A, strictly lower), for `forward_substitution`.
    """
    k, q, g, v, beta = x["k"], x["q"], x["g"], x["v"], x["beta"]
    length = beta.shape[-1]
    incl = torch.ones(length, length, dtype=torch.bool, device=g.device).tril()
    pre_h = x["pre"][:, :, None, :]  # [B, S, 1, L]
    hi_h = x["read_hi"][:, :, None, :]
    eye = torch.eye(length, dtype=g.dtype, device=g.device)
    r_v = torch.where(pre_h[..., None], x["u_known"], beta[..., None] * v)
    if per_channel:
        gc = g.cumsum(-2)  # [B, S, HV, L, K]
        pair = torch.exp((gc[..., :, None, :] - gc[..., None, :, :]).masked_fill(~incl[..., None], float("-inf")))  # [.., t, i, K]
        a = (beta[..., None] * torch.einsum("...tk,...tik,...ik->...ti", k, pair, k)).tril(-1)
        d = keep_checkpoint(gc, eps, True)[..., None] * torch.exp(gc)  # [B, S, HV, L, K]
        r_k = torch.where(pre_h, 0.0, beta)[..., None] * d * k
        qd = d * q
        g_end = gc[..., -1, :]  # [B, S, HV, K]; padding has g = 0, so the last position carries the segment's total
        keep_end = keep_checkpoint(g_end, eps, True)[..., None]
        m = torch.einsum("...tk,...tik,...ik->...ti", q, pair, k)
        d_end = keep_end * torch.exp(g_end)
        k_end = torch.exp(g_end[..., None, :] - gc) * k
        r_c = beta[..., None] * keep_end[..., None] * torch.exp(gc) * k if closed else None
    else:
        gc = g.cumsum(-1)  # [B, S, HV, L]
        decay = torch.exp((gc[..., :, None] - gc[..., None, :]).masked_fill(~incl, float("-inf")))  # [.., t, i]
        a = (beta[..., None] * decay * (k @ k.transpose(-1, -2))).tril(-1)
        d = keep_checkpoint(gc, eps, False) * torch.exp(gc)  # [B, S, HV, L]
        r_k = torch.where(pre_h, 0.0, beta * d)[..., None] * k
        qd = d[..., None] * q
        g_end = gc[..., -1]  # padding has g = 0, so the last position carries the segment's total
        m = decay * (q @ k.transpose(-1, -2))
        d_end = (keep_checkpoint(g_end, eps, False) * torch.exp(g_end))[..., None]
        k_end = torch.exp(g_end[..., None] - gc)[..., None] * k
        r_c = (beta * torch.exp(gc) * keep_checkpoint(g_end, eps, False)[..., None])[..., None] * k if closed else None
    rhs = torch.cat([r_v, r_k * hi_h[..., None], r_k * ~hi_h[..., None]], dim=-1)
    a_open = a * ~pre_h[..., None]  # carried entries keep their stored u
    sol = rhs if substitute else torch.linalg.solve_triangular(eye + a_open, rhs, upper=False, unitriangular=True)
    dv, dk = v.shape[-1], k.shape[-1]
    out = {
        "q_hi": qd * hi_h[..., None], "q_lo": qd * ~hi_h[..., None], "m": m, "d_end": d_end, "k_end": k_end,
    }
    solved = ("r_v", "r_hi", "r_lo") if substitute else ("u0", "w_hi", "w_lo")
    out.update(zip(solved, (sol[..., :dv], sol[..., dv:dv + dk], sol[..., dv + dk:])))
    if substitute:
        out["a"] = a_open
    if closed:
        xc = torch.linalg.solve_triangular(eye + a, torch.cat([beta[..., None] * v, r_c], dim=-1), upper=False, unitriangular=True)
        out["u0_c"], out["w_c"] = xc[..., :dv], xc[..., dv:]
    return out

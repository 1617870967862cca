"""Teacher-forced ReplaySSM Kimi Delta Attention: parallel inside each segment, sequential between checkpoints.

A segment is the run of buffer entries between two checkpoints (the first segment of a call
starts with the entries carried in the ReplayState's buffer; they keep their stored u). The
segment grid (`gdn.chunked.segment_layout`) is the same as Gated DeltaNet's. Inside a segment,
with gc_t [K] the log of the per-channel decay from the checkpoint through entry t,
d_t = exp(gc_t) (0 where `skip_read_below` drops the checkpoint term) and the pairwise decays
P_ti = exp(gc_t - gc_i) [K] (i <= t), the delta rule of `reference.py` reads

    u_t + beta_t sum_{i<t} (k_t . P_ti k_i) u_i = beta_t (v_t - S_src(t)^T (d_t k_t))

a unit-lower-triangular system (WY / UT form). Tokens reading S_hi and tokens reading S_lo only
differ in their right-hand side, so with T = (I + A)^-1 every u of the segment is

    U = T beta V - (T R_hi) S_hi - (T R_lo) S_lo        R_x: rows beta_t (d_t k_t)^T of tokens reading x
    O = (d Q)_hi S_hi + (d Q)_lo S_lo + M U             M_ti = q_t . P_ti k_i, i <= t
    S_fold = diag(d_end) S_hi + sum_i (P_end,i k_i) u_i^T                               (open fold)

and a closed fold solves the same system with every row reading S_hi and every entry's u
recomputed from its raw (v, beta). The pairwise decays are formed per channel ([L, L, K]) rather
than factored as exp(gc_t) exp(-gc_i), which overflows for strongly decaying channels.
Everything that does not depend on the checkpoint is computed for a block of segments at once
(`precompute`, also the input of the Triton kernel); the loop over segments only applies the
checkpoint and `write_checkpoint`, all sequences together whatever their phase. With a buffer dtype
(`#buf=bf16|fp16`) the buffered u's are rounded before later entries use them, and U is found row by row
(`gdn.chunked.forward_substitution`), as for Gated DeltaNet.
"""

from __future__ import annotations

import torch

from replayssm_eval.kernels.gdn.chunked import Segments, _pad, forward_substitution, segment_layout
from replayssm_eval.kernels.kda._common import (
    Prepared, buffer_keys, empty_buffer, from_format_layout, keep_checkpoint, to_format_layout,
)
from replayssm_eval.kernels.state import ReplayState, write_checkpoint

_BLOCK_ELEMENTS = 1 << 26  # budget for one block of precomputed segment tensors, in elements


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """[B, NS, L, HV, ...] -> [B, NS, HV, L, ...]."""
    return x.transpose(2, 3)


def padded_inputs(p: Prepared, seg: Segments) -> dict[str, torch.Tensor]:
    """Tokens and carried entries on the segment grid, heads first: k, q, g [B, NS, HV, L, K]; v, u_known
    [B, NS, HV, L, V]; beta [B, NS, HV, L]; pre (carried entry, u known), read_hi [B, NS, L] bool."""
    bsz, seqlen = p.q.shape[:2]
    buf = p.state.buffer
    expand = lambda t: t.repeat_interleave(p.groups, dim=2) if p.groups > 1 else t  # noqa: E731  [B, cap, H, K] -> HV
    return {
        "k": _heads_first(_pad(seg, p.k, expand(buf["k"]))),
        "q": _heads_first(_pad(seg, p.q, None)),
        "g": _heads_first(_pad(seg, p.g, buf["g"])),
        "v": _heads_first(_pad(seg, p.v, buf.get("v"))),
        "beta": _pad(seg, p.beta, buf.get("beta")).transpose(2, 3),
        "u_known": _heads_first(_pad(seg, torch.zeros_like(p.v), buf["u"])),
        "pre": _pad(seg, torch.zeros(bsz, seqlen, dtype=torch.bool, device=p.q.device),
                    torch.ones_like(buf["u"][..., 0, 0], dtype=torch.bool)),
        "read_hi": _pad(seg, p.plan.read_hi, None),
    }


def block_size(seg: Segments, bsz: int, nv: int, dk: int, dv: int) -> int:
    """Segments per precompute block: the [L, L, K] pairwise decays dominate."""
    per_segment = bsz * nv * seg.length * (3 * dk + 4 * dv + 3 * seg.length + seg.length * dk)
    return max(1, min(seg.num, _BLOCK_ELEMENTS // max(per_segment, 1)))


def _chunked_torch(p: Prepared) -> tuple[torch.Tensor, ReplayState]:
    """backend="torch" of `kda.chunked`: o [B, T, HV, V] in the compute dtype and the ReplayState after the call."""
    cfg, st, cd = p.config, p.state, p.dtype
    bsz, seqlen, nv, dk = p.q.shape
    dv = p.v.shape[-1]
    closed = cfg.gdn_fold == "closed"
    substitute = cfg.buffer_dtype != "fp32"  # each u rounded before the later ones use it: no joint solve
    seg = segment_layout(p)
    x = padded_inputs(p, seg)
    hi32, lo32 = st.hi, st.lo
    s_hi, s_lo = from_format_layout(hi32).to(cd), from_format_layout(lo32).to(cd)  # [B, HV, K, V]
    ckpt = st.checkpoint.clone()
    u_all = torch.empty(bsz, seg.num, nv, seg.length, dv, dtype=cd, device=p.q.device)
    o_all = torch.empty_like(u_all)
    block = block_size(seg, bsz, nv, dk, dv)
    rows = torch.arange(bsz, device=p.q.device)

    for start in range(0, seg.num, block):
        sl = slice(start, min(start + block, seg.num))
        blk = precompute({name: t[:, sl] for name, t in x.items()}, cfg.skip_read_below, closed, substitute)
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
                new_hi, new_lo = write_checkpoint(to_format_layout(state[idx]).contiguous(), cfg, p.layer, p.seq_ids[idx], ckpt[idx] + 1)
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
    new_buf = empty_buffer(buffer_keys(cfg), bsz, p.capacity, st.buffer["k"].shape[2], nv, dk, dv, p.q.device, p.dtype)
    sources = {
        "k": lambda: _pad(seg, p.k_heads, st.buffer["k"]), "u": lambda: u_seg, "g": lambda: _pad(seg, p.g, st.buffer["g"]),
        "v": lambda: _pad(seg, p.v, st.buffer.get("v")), "beta": lambda: _pad(seg, p.beta, st.buffer.get("beta")),
    }
    keep = torch.arange(seg.length, device=p.q.device)[None, :] < seg.count_after[:, None]  # [B, L]
    for name, t in new_buf.items():
        entries = sources[name]()[rows, last_seg].to(p.dtype)  # [B, L, ...]
        mask = keep.view(bsz, seg.length, *([1] * (entries.dim() - 2)))
        t[:, : seg.length] = torch.where(mask, entries, torch.zeros_like(entries))
    return ReplayState(
        hi=hi32, lo=lo32, buffer=new_buf, schedule=p.schedule_after, checkpoint=ckpt, seq_ids=p.seq_ids, layer=p.layer
    )


def precompute(x: dict[str, torch.Tensor], eps, closed, substitute=False) -> dict[str, torch.Tensor]:
    """Checkpoint-independent tensors of a block of segments (`padded_inputs` sliced to S segments).

    Returns u0, w_hi, w_lo ([B, S, HV, L, V], [.., L, K] x 2): U = u0 - w_hi S_hi - w_lo S_lo; q_hi, q_lo
    [.., L, K] and m [.., L, L]: O = q_hi S_hi + q_lo S_lo + m U; d_end [B, S, HV, K], k_end [.., L, K]: the
    open fold; closed: u0_c, w_c (every row from S_hi, u from the raw entries). substitute (a buffer dtype):
    the open system (I + A) U = R unsolved instead, r_v, r_hi, r_lo in place of u0, w_hi, w_lo and a [.., L, L]
    (A, strictly lower), for `forward_substitution`.
    """
    k, q, g, v, beta = x["k"], x["q"], x["g"], x["v"], x["beta"]
    length = g.shape[-2]
    gc = g.cumsum(-2)  # [B, S, HV, L, K]
    incl = torch.ones(length, length, dtype=torch.bool, device=g.device).tril()
    pair = torch.exp((gc[..., :, None, :] - gc[..., None, :, :]).masked_fill(~incl[..., None], float("-inf")))  # [.., t, i, K]
    kp = torch.einsum("...tk,...tik,...ik->...ti", k, pair, k)
    a = (beta[..., None] * kp).tril(-1)
    pre_h = x["pre"][:, :, None, :]  # [B, S, 1, L]
    hi_h = x["read_hi"][:, :, None, :]
    d = keep_checkpoint(gc, eps)[..., None] * torch.exp(gc)  # [B, S, HV, L, K]
    eye = torch.eye(length, dtype=g.dtype, device=g.device)
    r_v = torch.where(pre_h[..., None], x["u_known"], beta[..., None] * v)
    r_k = torch.where(pre_h, 0.0, beta)[..., None] * d * k
    rhs = torch.cat([r_v, r_k * hi_h[..., None], r_k * ~hi_h[..., None]], dim=-1)
    a_open = a * ~pre_h[..., None]  # carried entries keep their stored u
    sol = rhs if substitute else torch.linalg.solve_triangular(eye + a_open, rhs, upper=False, unitriangular=True)
    dv, dk = v.shape[-1], k.shape[-1]
    qd = d * q
    g_end = gc[..., -1, :]  # [B, S, HV, K]; padding has g = 0, so the last position carries the segment's total
    keep_end = keep_checkpoint(g_end, eps)[..., None]
    solved = ("r_v", "r_hi", "r_lo") if substitute else ("u0", "w_hi", "w_lo")
    out = {
        **dict(zip(solved, (sol[..., :dv], sol[..., dv:dv + dk], sol[..., dv + dk:]))),
        "q_hi": qd * hi_h[..., None], "q_lo": qd * ~hi_h[..., None],
        "m": torch.einsum("...tk,...tik,...ik->...ti", q, pair, k),
        "d_end": keep_end * torch.exp(g_end),
        "k_end": torch.exp(g_end[..., None, :] - gc) * k,
    }
    if substitute:
        out["a"] = a_open
    if closed:
        r_c = beta[..., None] * keep_end[..., None] * torch.exp(gc) * k
        xc = torch.linalg.solve_triangular(eye + a, torch.cat([beta[..., None] * v, r_c], dim=-1), upper=False, unitriangular=True)
        out["u0_c"], out["w_c"] = xc[..., :dv], xc[..., dv:]
    return out

"""Step-by-step ReplaySSM decode of the delta-rule families, pure torch: the ground truth for every backend.

Per value head (HF layout, S is K x V, A_t = exp(g_t): a scalar for Gated DeltaNet, diag(exp(g_t))
scaling the rows of S for Kimi Delta Attention's per-channel decay g_t [K]):

    u_t = beta_t (v_t - (A_t S_{t-1})^T k_t);   S_t = A_t S_{t-1} + k_t u_t^T;   o_t = S_t^T q_t

q and k are used as given: the Hugging Face layer (or, for KDA, the model adapter) has already
L2-normalised them and scaled q by K^-0.5; nothing here repeats that. Each function takes the
`Prepared` call of `_common.prepare_inputs`; the scalar-decay branches keep Gated DeltaNet's own
operation order, so its numbers do not depend on the per-channel code.

ReplaySSM (docs/semantics.md, "Decode semantics"; `replay.schedule`): the buffer holds every entry since the newest
checkpoint. Token n reads the copy src = S_hi if plan.read_hi[b, n] else S_lo of that checkpoint,
rebuilds S_{n-1} = G S_src + sum_{i<n} G k_i u_i^T from the buffer (G: decays since the
checkpoint or since entry i, per channel for KDA), computes u_n from it, outputs
o_n = (A_n S_{n-1} + k_n u_n^T)^T q_n and appends (k_n, u_n, g_n), u_n rounded to the buffer dtype
(`#buf`; the output used it as computed). If plan.fold_after[b, n] the buffer is folded:
- open (vLLM): S = G S_hi + sum_i G k_i u_i^T with each u_i as computed at its own step;
- closed (SGLang): the exact recurrence re-run from S_hi over the buffered raw (k, v, beta, g);
  a fold token that reads S_hi takes its output from this closed-fold state;
then `write_checkpoint` rounds S to both copies and the buffer is cleared. Window 1 is
conventional eager decoding (output from the unrounded updated state; open and closed coincide).
With `skip_read_below=eps`, a (sequence, head) whose cumulative decay since the checkpoint up to
and including token n is below eps (in every channel, `_common.keep_checkpoint`) drops the checkpoint term for token n (at a fold: the G S_hi
term, and a closed fold re-runs the recurrence from zero).

`speculative_decode_reference` simulates real speculative decoding (ring of L + T, T drafts per
step, output-only verification, commit by pointer move, early flush when h + T > L).
"""

from __future__ import annotations

import torch

from replayssm_eval.kernels.delta._common import Prepared, expand_heads, from_format_layout, keep_checkpoint, to_format_layout
from replayssm_eval.replay.schedule import ScheduleState, accepted_per_step
from replayssm_eval.replay.state import ReplayState, write_checkpoint


def decode(p: Prepared) -> tuple[torch.Tensor, ReplayState]:
    """Decode the T tokens of the call one at a time for B sequences, each at its own window phase.

    Returns o [B, T, HV, V] in the compute dtype and the ReplayState after the call (its hi / lo are
    [B, HV, V, K], see `_common.checkpoint_kv`).
    """
    cfg, st, cd = p.config, p.state, p.dtype
    per_channel = p.per_channel
    bsz, seqlen, nv, _ = p.q.shape
    buf = st.buffer
    hi32, lo32 = st.hi, st.lo  # [B, HV, V, K] fp32 stored copies
    hi, lo = from_format_layout(hi32).to(cd), from_format_layout(lo32).to(cd)  # [B, HV, K, V]
    count, ckpt = st.schedule.count.clone(), st.checkpoint.clone()
    rows = torch.arange(bsz, device=p.q.device)
    slots = torch.arange(p.capacity, device=p.q.device)
    o = torch.empty(bsz, seqlen, nv, p.v.shape[-1], dtype=cd, device=p.q.device)

    for n in range(seqlen):
        pos = count.clone()
        buf["k"][rows, pos] = p.k_heads[:, n]
        buf["g"][rows, pos] = p.g[:, n]
        if "v" in buf:
            buf["v"][rows, pos] = p.v[:, n]
            buf["beta"][rows, pos] = p.beta[:, n]
        count = count + 1
        gcum = buf["g"].cumsum(1)  # [B, cap, HV(, K)]; entries past count are zero
        g_now = gcum[rows, pos]  # [B, HV(, K)] log of the decay from the checkpoint through token n
        keep = keep_checkpoint(g_now, cfg.skip_read_below, per_channel)  # [B, HV]
        src = torch.where(p.plan.read_hi[:, n, None, None, None], hi, lo)
        kb = expand_heads(buf["k"], p.groups)  # [B, cap, HV, K]
        k_n, q_n = p.k[:, n], p.q[:, n]  # [B, HV, K]
        if per_channel:  # A_n S_{n-1} from the checkpoint and the buffer
            before = (slots[None, :] < pos[:, None])[..., None, None]  # [B, cap, 1, 1]
            w = torch.exp((g_now[:, None] - gcum).masked_fill(~before, float("-inf")))  # [B, cap, HV, K]
            s_dec = (keep[..., None] * torch.exp(g_now))[..., None] * src + torch.einsum("bchk,bchv->bhkv", w * kb, buf["u"])
            u = p.beta[:, n, :, None] * (p.v[:, n] - torch.einsum("bhkv,bhk->bhv", s_dec, k_n))
            s_new = s_dec + k_n[..., None] * u[..., None, :]
        else:
            g_n = p.g[:, n]
            g_prev = g_now - g_n
            before = (slots[None, :] < pos[:, None])[..., None]  # [B, cap, 1]
            w = torch.exp(g_prev[:, None] - gcum) * before  # [B, cap, HV]
            s_prev = (keep * torch.exp(g_prev))[..., None, None] * src + torch.einsum("bch,bchk,bchv->bhkv", w, kb, buf["u"])
            alpha = torch.exp(g_n)[..., None]  # [B, HV, 1]
            u = p.beta[:, n, :, None] * (p.v[:, n] - alpha * torch.einsum("bhkv,bhk->bhv", s_prev, k_n))
            s_new = alpha[..., None] * s_prev + k_n[..., None] * u[..., None, :]
        o[:, n] = torch.einsum("bhkv,bhk->bhv", s_new, q_n)
        buf["u"][rows, pos] = cfg.round_buffered(u)  # the output above uses u as computed; the buffer keeps it rounded

        fold = p.plan.fold_after[:, n]
        if not fold.any():
            continue
        idx = fold.nonzero().flatten()
        sub = {name: t[idx] for name, t in buf.items()}
        keep_f = keep[idx]
        if cfg.gdn_fold == "open":
            folded = fold_open(hi[idx], sub, count[idx], keep_f, p.groups)
        else:
            folded = fold_closed(hi[idx], sub, count[idx], keep_f, p.groups)
            reads_hi = p.plan.read_hi[idx, n, None, None]
            o[idx, n] = torch.where(reads_hi, torch.einsum("bhkv,bhk->bhv", folded, q_n[idx]), o[idx, n])
        residual = {copy: t[idx] for copy, t in st.residual.items()}
        new_hi, new_lo = write_checkpoint(to_format_layout(folded).contiguous(), cfg, p.layer, p.seq_ids[idx], ckpt[idx] + 1,
                                          residual)
        for copy, t in residual.items():
            st.residual[copy][idx] = t
        hi32, lo32 = _assign(hi32, lo32, idx, new_hi, new_lo, cfg.shared)
        hi[idx], lo[idx] = from_format_layout(new_hi).to(cd), from_format_layout(new_lo).to(cd)
        ckpt[idx] += 1
        count[idx] = 0
        for t in buf.values():
            t[idx] = 0

    return o, ReplayState(
        hi=hi32, lo=lo32, buffer=buf, schedule=p.schedule_after, checkpoint=ckpt, seq_ids=p.seq_ids, layer=p.layer,
        residual=st.residual,
    )


def _assign(hi32, lo32, idx, new_hi, new_lo, shared):
    hi32 = hi32.clone()
    hi32[idx] = new_hi
    if shared:
        return hi32, hi32
    lo32 = lo32.clone()
    lo32[idx] = new_lo
    return hi32, lo32


def fold_open(hi, buf, count, keep, groups) -> torch.Tensor:
    """S = G S_hi + sum_i G_{i+1..} k_i u_i^T over the count[b] buffered entries (entries past the count are zero).

    hi: [B, HV, K, V]; buf: k [B, cap, H, K], u [B, cap, HV, V], g [B, cap, HV] or [B, cap, HV, K]; count: [B];
    keep: [B, HV].
    """
    gcum = buf["g"].cumsum(1)  # entries past the count are zero, so the last slot carries the total
    g_total = gcum[:, -1]  # [B, HV(, K)]
    kb = expand_heads(buf["k"], groups)
    if buf["g"].dim() == 4:
        valid = (torch.arange(gcum.shape[1], device=hi.device)[None, :] < count[:, None])[..., None, None]
        w = torch.exp((g_total[:, None] - gcum).masked_fill(~valid, float("-inf")))  # [B, cap, HV, K]
        return (keep[..., None] * torch.exp(g_total))[..., None] * hi + torch.einsum("bchk,bchv->bhkv", w * kb, buf["u"])
    w = torch.exp(g_total[:, None] - gcum)  # [B, cap, HV]
    return (keep * torch.exp(g_total))[..., None, None] * hi + torch.einsum("bch,bchk,bchv->bhkv", w, kb, buf["u"])


def fold_closed(hi, buf, count, keep, groups) -> torch.Tensor:
    """The exact recurrence from S_hi (or from zero where keep is 0) over the buffered raw entries."""
    state = keep[..., None, None] * hi
    kb = expand_heads(buf["k"], groups)
    for i in range(buf["g"].shape[1]):
        valid = (i < count)[:, None, None, None]
        k_i = kb[:, i]
        if buf["g"].dim() == 4:
            s_dec = torch.exp(buf["g"][:, i])[..., None] * state  # [B, HV, K, V]
            u = buf["beta"][:, i, :, None] * (buf["v"][:, i] - torch.einsum("bhkv,bhk->bhv", s_dec, k_i))
            state = torch.where(valid, s_dec + k_i[..., None] * u[..., None, :], state)
            continue
        alpha = torch.exp(buf["g"][:, i])[..., None]  # [B, HV, 1]
        u = buf["beta"][:, i, :, None] * (buf["v"][:, i] - alpha * torch.einsum("bhkv,bhk->bhv", state, k_i))
        state = torch.where(valid, alpha[..., None] * state + k_i[..., None] * u[..., None, :], state)
    return state


def speculative_decode(p: Prepared) -> tuple[torch.Tensor, ReplayState]:
    """Speculative decoding as a serving engine runs it; the committed outputs of every token.

    Returns as `decode`; the config must carry a speculative schedule
    (`#spec=T:alpha`). Per sequence and step: T draft entries (the next T tokens; fewer at the
    end of the input) are written into the ring after the h committed ones; output-only
    verification computes every draft's u (delta rule, from the checkpoint copy the step reads
    and the committed buffer) and output,

        O = S_ckpt^T Q D + U (W (.) (K^T Q))     D: cumulative decays of the draft positions,
                                                  W: causal decay mask over committed + drafts,

    without writing any state; `accepted_per_step` gives the committed prefix, committed by moving
    the ring pointer (rejected drafts are simply overwritten). After a step, h + T > L triggers
    the early flush (fold as in `decode_reference`, checkpoint written, next step reads S_hi).
    A step cut by the end of the call is finished by the next call (ScheduleState.step_left).
    """
    cfg, st, cd = p.config, p.state, p.dtype
    if cfg.speculative is None:
        raise ValueError(f"config {cfg.name!r} has no speculative schedule; expected one with #spec=T:alpha")
    drafts, window = cfg.speculative.drafts, cfg.window
    bsz, seqlen, nv, _ = p.q.shape
    o = torch.empty(bsz, seqlen, nv, p.v.shape[-1], dtype=cd, device=p.q.device)
    hi32, buf = st.hi.clone(), st.buffer
    lo32 = hi32 if cfg.shared else st.lo.clone()
    sched = st.schedule
    count, left, read_hi, steps, ckpt = (t.clone() for t in (sched.count, sched.step_left, sched.step_read_hi, sched.steps, st.checkpoint))

    for b in range(bsz):
        ring = {name: t[b] for name, t in buf.items()}  # views: writes land in buf
        seq = int(p.seq_ids[b])
        h, n = int(count[b]), 0
        while n < seqlen:
            if int(left[b]) == 0:  # a new step: T drafts, a committed prefix drawn now
                left[b] = accepted_per_step(cfg.seed, seq, int(steps[b]), drafts, cfg.speculative.accept)
                steps[b] += 1
                width = min(drafts, seqlen - n)
            else:  # the rest of a step begun in the previous call: its remaining drafts are the accepted ones
                width = min(int(left[b]), seqlen - n)
            commit = min(int(left[b]), width)
            step_hi = bool(read_hi[b])
            drafted = slice(n, n + width)
            ring["k"][h:h + width] = p.k_heads[b, drafted]
            ring["g"][h:h + width] = p.g[b, drafted]
            if "v" in ring:
                ring["v"][h:h + width] = p.v[b, drafted]
                ring["beta"][h:h + width] = p.beta[b, drafted]
            src = from_format_layout(hi32[b] if step_hi else lo32[b]).to(cd)
            u_d, o_d = verify_drafts(src, ring, h, width, p.q[b, drafted], p.v[b, drafted], p.beta[b, drafted], p.groups, cfg.skip_read_below)
            ring["u"][h:h + width] = cfg.round_buffered(u_d)
            o[b, n:n + commit] = o_d[:commit]
            h, n = h + commit, n + commit  # commit: move the pointer
            left[b] -= commit
            for t in ring.values():
                t[h:] = 0  # rejected drafts: overwritten by the next step (zeroed for a canonical state)
            if int(left[b]) > 0:
                continue
            read_hi[b] = h + drafts > window
            if not bool(read_hi[b]):
                continue
            one = {name: t[None] for name, t in ring.items()}
            g_total = (ring["g"].sum(0) if p.per_channel else ring["g"].cumsum(0)[h - 1])[None]  # [1, HV(, K)]
            keep = keep_checkpoint(g_total, cfg.skip_read_below, p.per_channel)  # [1, HV]
            hi_b = from_format_layout(hi32[b]).to(cd)[None]
            h_t = torch.tensor([h], device=hi_b.device)
            if cfg.gdn_fold == "open":
                folded = fold_open(hi_b, one, h_t, keep, p.groups)
            else:
                folded = fold_closed(hi_b, one, h_t, keep, p.groups)
                if step_hi:
                    o[b, n - 1] = torch.einsum("hkv,hk->hv", folded[0], p.q[b, n - 1])
            residual = {copy: t[b:b + 1] for copy, t in st.residual.items()}
            new_hi, new_lo = write_checkpoint(to_format_layout(folded).contiguous(), cfg, p.layer, p.seq_ids[b:b + 1],
                                              ckpt[b:b + 1] + 1, residual)
            for copy, t in residual.items():
                st.residual[copy][b:b + 1] = t
            hi32[b] = new_hi[0]
            if not cfg.shared:
                lo32[b] = new_lo[0]
            ckpt[b] += 1
            h = 0
            for t in ring.values():
                t.zero_()
        count[b] = h

    schedule = ScheduleState(count=count, step_left=left, step_read_hi=read_hi, steps=steps)
    return o, ReplayState(
        hi=hi32, lo=lo32, buffer=buf, schedule=schedule, checkpoint=ckpt, seq_ids=p.seq_ids, layer=p.layer,
        residual=st.residual,
    )


def verify_drafts(src, ring, h, width, q_d, v_d, beta_d, groups, eps):
    """Output-only verification of `width` drafts after h committed entries, for one sequence.

    src: [HV, K, V] checkpoint copy read; ring: k [cap, H, K], u [cap, HV, V], g [cap, HV] or [cap, HV, K] with the
    drafts' k, g already written at [h, h + width); q_d: [W, HV, K]; v_d: [W, HV, V]; beta_d: [W, HV].
    Returns the drafts' u [W, HV, V] and outputs O [W, HV, V]; writes nothing.

    Per channel, with E = h + W entries, gc [HV, E, K] their cumulative log-decays and the causal pairwise decays
    P[i, j] = exp(gc_{h+j} - gc_i) [K] (entry i <= draft j), the drafts' u solve

        (I + A) U_d = beta (V - (D K_d) S - W_cd^T U_c),   A[j, i] = beta_j sum_k k_j P[h+i, j] k_i  (i < j)

    and O = (D Q) S + sum_i (q_j . P[i, j] k_i) u_i, D = exp(gc) of the drafts (0 where skipped).
    """
    end = h + width
    per_channel = ring["g"].dim() == 3
    k_all = expand_heads(ring["k"][:end], groups).transpose(0, 1)  # [HV, E, K]
    gc = ring["g"][:end].cumsum(0).transpose(0, 1)  # [HV, E(, K)]
    g_d = gc[:, h:]  # [HV, W(, K)] cumulative decay of the draft positions (log)
    causal = torch.ones(end, width, dtype=torch.bool, device=gc.device).triu(-h)  # entry i <= draft j
    q_t, v_t, beta_t = q_d.transpose(0, 1), v_d.transpose(0, 1), beta_d.transpose(0, 1)  # [HV, W, *]
    k_d = k_all[:, h:]  # [HV, W, K]
    u_c = ring["u"][:h].transpose(0, 1)  # [HV, h, V] committed
    eye = torch.eye(width, dtype=gc.dtype, device=gc.device)
    if per_channel:
        d = keep_checkpoint(g_d, eps, True)[..., None] * torch.exp(g_d)  # [HV, W, K]
        pair = torch.exp((g_d[:, None] - gc[:, :, None]).masked_fill(~causal[None, :, :, None], float("-inf")))  # [HV, E, W, K]
        wk = torch.einsum("hik,hjk,hijk->hij", k_all, k_d, pair)  # [HV, E, W] weight of u_i in draft j's S^T k_j
        wq = torch.einsum("hik,hjk,hijk->hij", k_all, q_t, pair)  # [HV, E, W] weight of u_i in o_j
        rhs = v_t - (d * k_d) @ src - wk[:, :h].transpose(1, 2) @ u_c
        a = beta_t[..., None] * wk[:, h:].transpose(1, 2).tril(-1)  # [HV, W(j), W(i)], i < j
        u_d = torch.linalg.solve_triangular(eye + a, beta_t[..., None] * rhs, upper=False, unitriangular=True)
        u_all = torch.cat([u_c, u_d], dim=1)  # [HV, E, V]
        out = (d * q_t) @ src + wq.transpose(1, 2) @ u_all
        return u_d.transpose(0, 1), out.transpose(0, 1)
    d = keep_checkpoint(g_d, eps, False) * torch.exp(g_d)  # D
    w = torch.exp((g_d[:, None, :] - gc[:, :, None]).masked_fill(~causal, float("-inf")))  # [HV, E, W]
    # delta rule for the drafts: (I + A) U_d = beta (V - D K_d S - U_c^T (W_cd (.) K_c K_d^T))
    rhs = v_t - d[..., None] * (k_d @ src) - (w[:, :h] * (k_all[:, :h] @ k_d.transpose(1, 2))).transpose(1, 2) @ u_c
    a = (w[:, h:] * (k_d @ k_d.transpose(1, 2))).transpose(1, 2).tril(-1)  # [HV, W(j), W(i)], i < j
    a = beta_t[..., None] * a
    u_d = torch.linalg.solve_triangular(eye + a, beta_t[..., None] * rhs, upper=False, unitriangular=True)
    u_all = torch.cat([u_c, u_d], dim=1)  # [HV, E, V]
    out = d[..., None] * (q_t @ src) + (w * (k_all @ q_t.transpose(1, 2))).transpose(1, 2) @ u_all
    return u_d.transpose(0, 1), out.transpose(0, 1)

"""Triton pieces of the decode kernels shared by the delta-rule families (gdn: scalar decay, kda: per-channel decay).

- the packed read copy's tile in the step kernels (`load_packed`) and its launch arguments (`read_args`,
  from the read format's `packed_codec`; a kernel takes a format as its codec's KIND and GROUP constexprs);
- the single-token kernels' row dots S_src^T k, S_src^T q of a block of state rows in one pass over K (`rowdots`:
  S_hi, or the packed read copy through the fast decoders, NVFP4 as bytes split by nibble or as whole int32 words
  of 8 codes, in tiles, `nvfp4_partials`, or by rows, `nvfp4_rowwise`) and the read copy's global scales
  (`scale_rows`);
- the single-token step and verification in the `KernelFamily` call convention (`decode_step`,
  `verify`), around each family's launcher, and the conventional step's launch (`conventional_launch`).
The chunked kernels' shared pieces are `triton_chunk`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.formats.codec import Group, Kind, packed_codec
from replayssm_eval.formats.device import (
    E2M1_F16_SCALE, GROUP_HEAD, GROUP_ROW, GROUP_TENSOR, NVFP4, decode_elements, e2m1_decode, e2m1_f16, e2m1_f16_hi,
    e2m1_f16_pair, e4m3_decode, e4m3_fast, nibble_lanes,
)
from replayssm_eval.kernels.delta._common import Prepared, to_format_layout
from replayssm_eval.kernels.step_variants import step_variant
from replayssm_eval.replay.buffer_round import buffer_kind
from replayssm_eval.replay.state import ReplayState, write_checkpoint_packed, write_read_copy_packed, zero_residual


@triton.jit
def load_packed(data_ptr, scales_ptr, gs_ptr, b, hv, vs, ks, HV, V, K, KP, KIND: tl.constexpr, GROUP: tl.constexpr):
    """Decode the read copy's tile [BK, BV] (k, v) of (b, hv) from its packed encoding (`read_args`)."""
    mask = (ks[:, None] < K) & (vs[None, :] < V)
    rowid = (b * HV + hv) * V + vs[None, :]  # format row (b, hv, v)
    if KIND == NVFP4:
        byte = tl.load(data_ptr + rowid.to(tl.int64) * (KP // 2) + ks[:, None] // 2, mask=mask, other=0).to(tl.int32)
        nib = tl.where(ks[:, None] % 2 == 0, byte & 0xF, byte >> 4)
        sb = tl.load(scales_ptr + rowid.to(tl.int64) * (KP // 16) + ks[:, None] // 16, mask=mask, other=0)
        x = (e2m1_decode(nib) * e4m3_decode(sb))
    else:
        x = decode_elements(tl.load(data_ptr + rowid.to(tl.int64) * K + ks[:, None], mask=mask, other=0), KIND)
    if GROUP == GROUP_ROW:
        x = x * tl.load(gs_ptr + rowid, mask=vs[None, :] < V, other=1.0)
    elif GROUP == GROUP_HEAD:
        x = x * tl.load(gs_ptr + b * HV + hv)
    elif GROUP == GROUP_TENSOR:
        x = x * tl.load(gs_ptr + b)
    return tl.where(mask, x, 0.0)


@triton.jit
def nvfp4_partials(data_ptr, scale_ptr, rows, mask_v, kd, qd, C: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr):
    """Per packed word w, (sum_j X[r, 8 w + j] kd[8 w + j], the same with qd), [BLOCK_V, BK // 8] each, over columns
    C .. C + BK of the NVFP4 rows `rows` ([BLOCK_V] format rows; X: E2M1 codes times E4M3 block scales, without the
    global scale). The codes load as whole int32 words of 8 and decode in pairs by bit operations (`e2m1_f16_pair`);
    each word's partial sum takes its block scale. kd, qd: [BK] FP32, 0 past K; C a multiple of 16, BK >= 16."""
    BW: tl.constexpr = BK // 8
    ws = C // 8 + tl.arange(0, BW)
    wmask = mask_v[:, None] & (ws < KP // 8)[None, :]
    words = tl.load(data_ptr.to(tl.pointer_type(tl.int32)) + rows[:, None] * (KP // 8) + ws[None, :], mask=wmask,
                    other=0)  # [BLOCK_V, BW]: codes 8 w .. 8 w + 7, nibble j = code 8 w + j
    kl = nibble_lanes(kd, BW)
    ql = nibble_lanes(qd, BW)
    pk = tl.zeros(words.shape, dtype=tl.float32)
    pq = tl.zeros(words.shape, dtype=tl.float32)
    for j in tl.static_range(4):
        lo, hi = e2m1_f16_pair(words, j)  # codes 8 w + j, 8 w + j + 4, times 2^-14
        pk += lo * kl[j][None, :] + hi * kl[j + 4][None, :]
        pq += lo * ql[j][None, :] + hi * ql[j + 4][None, :]
    sb = tl.load(scale_ptr + rows[:, None] * (KP // 16) + ws[None, :] // 2, mask=wmask, other=0)  # two words a block
    sc = e4m3_fast(sb) * E2M1_F16_SCALE
    return pk * sc, pq * sc


@triton.jit
def _lanes(quad):
    """The four lanes of quad [BLOCK_V, 4] (one thread's 16 bytes a row), split apart in registers: four [BLOCK_V]."""
    even, odd = tl.split(tl.reshape(quad, (quad.shape[0], 2, 2)))  # lanes (0, 2), (1, 3)
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def _row_quads(ptr, rows, C: tl.constexpr, K: tl.constexpr):
    """ptr[C .. C + 3] (0 at K and past) in every thread holding a row of `rows`: one 16-byte load a thread
    (`_lanes`); four [BLOCK_V] tensors."""
    cols = C + tl.arange(0, 4)
    return _lanes(tl.load(ptr + tl.broadcast_to(cols[None, :], (rows.shape[0], 4)), mask=(cols < K)[None, :],
                          other=0.0))


@triton.jit
def _row_words(words_ptr, mask_v, C: tl.constexpr, NW: tl.constexpr):
    """Words C .. C + 3 (int32, 0 at NW and past) of each row: words_ptr [BLOCK_V] the rows' first words; one 16-byte
    load a thread holding a row (`_lanes`); four [BLOCK_V] tensors."""
    cols = C + tl.arange(0, 4)
    return _lanes(tl.load(words_ptr[:, None] + cols[None, :], mask=mask_v[:, None] & (cols < NW)[None, :], other=0))


@triton.jit
def _rowwise_block(sk, sq, word_a, word_b, scale, blk: tl.constexpr, rows, k_ptr, q_ptr, K: tl.constexpr):
    """sk, sq plus scale block blk of the rows (its words 2 blk and 2 blk + 1 and its E4M3 scale byte, each row's own;
    the words decoded in pairs by `e2m1_f16_pair` against k and q loaded four values at a time, `_row_quads`)."""
    bk = tl.zeros(rows.shape, dtype=tl.float32)
    bq = tl.zeros(rows.shape, dtype=tl.float32)
    for half in tl.static_range(2):
        if 16 * blk + 8 * half < K:  # word w = 2 blk + half: codes 8 w .. 8 w + 7
            word = word_a if half == 0 else word_b
            ka = _row_quads(k_ptr, rows, 16 * blk + 8 * half, K)
            kb = _row_quads(k_ptr, rows, 16 * blk + 8 * half + 4, K)
            qa = _row_quads(q_ptr, rows, 16 * blk + 8 * half, K)
            qb = _row_quads(q_ptr, rows, 16 * blk + 8 * half + 4, K)
            for j in tl.static_range(4):
                lo, hi = e2m1_f16_pair(word, j)  # codes 8 w + j, 8 w + j + 4, times 2^-14
                bk += lo * ka[j]
                bk += hi * kb[j]
                bq += lo * qa[j]
                bq += hi * qb[j]
    sc = e4m3_fast(scale) * E2M1_F16_SCALE
    return sk + bk * sc, sq + bq * sc


@triton.jit
def nvfp4_rowwise(data_ptr, scale_ptr, rows, mask_v, k_ptr, q_ptr, K: tl.constexpr, KP: tl.constexpr):
    """(sum_c X[r, c] k[c], the same with q), [BLOCK_V] each, of the NVFP4 rows `rows` (X: E2M1 codes times E4M3 block
    scales, without the global scale), each row summed whole by the thread that holds it: the tensors are [BLOCK_V],
    so no sum crosses threads. A row's int32 words of 8 codes load four at a time (`_row_words`: two scale blocks),
    with the two blocks' scale bytes in one load, and decode in pairs by bit operations; every thread loads k and q
    four values at a time (`_row_quads`)."""
    words_ptr = data_ptr.to(tl.pointer_type(tl.int32)) + rows * (KP // 8)
    sk = tl.zeros(rows.shape, dtype=tl.float32)
    sq = tl.zeros(rows.shape, dtype=tl.float32)
    for pair in tl.static_range((KP // 16 + 1) // 2):
        w0, w1, w2, w3 = _row_words(words_ptr, mask_v, 4 * pair, KP // 8)
        blocks = 2 * pair + tl.arange(0, 2)
        s0, s1 = tl.split(tl.load(scale_ptr + rows[:, None] * (KP // 16) + blocks[None, :],
                                  mask=mask_v[:, None] & (blocks < KP // 16)[None, :], other=0))  # [BLOCK_V] bytes
        sk, sq = _rowwise_block(sk, sq, w0, w1, s0, 2 * pair, rows, k_ptr, q_ptr, K)
        if 2 * pair + 1 < KP // 16:
            sk, sq = _rowwise_block(sk, sq, w2, w3, s1, 2 * pair + 1, rows, k_ptr, q_ptr, K)
    return sk, sq


@triton.jit
def scale_rows(x, gs_ptr, b, bh, rows, mask_v, GROUP: tl.constexpr):
    """x [BLOCK_V] of the read copy's rows `rows` times their global scale (`read_args`: per row, head or sequence)."""
    if GROUP == GROUP_ROW:
        x = x * tl.load(gs_ptr + rows, mask=mask_v, other=1.0)
    elif GROUP == GROUP_HEAD:
        x = x * tl.load(gs_ptr + bh)
    elif GROUP == GROUP_TENSOR:
        x = x * tl.load(gs_ptr + b)
    return x


@triton.jit
def rowdots(hi_ptr, data_ptr, scale_ptr, gs_ptr, k_ptr, q_ptr, b, bh, rows, mask_v, read_hi,
             K: tl.constexpr, KP: tl.constexpr, KIND: tl.constexpr, GROUP: tl.constexpr,
             BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, WORDS: tl.constexpr):
    """(S_src^T k, S_src^T q), [BLOCK_V] each, of the state rows `rows` ([BLOCK_V] in [B, HV, V]) in one pass over K:
    S_src = S_hi (FP32) if read_hi else the packed read copy (times its global scale). k_ptr, q_ptr: the vectors [K]
    (FP32; GDN: the token's k, q; KDA: the decayed d k, d q). WORDS, how NVFP4 codes load: 0 as bytes split by
    nibble and 1 as whole int32 words (`nvfp4_partials`), both in [BLOCK_V, BLOCK_K] tiles whose sums cross threads,
    2 as whole words summed by the thread holding the row (`nvfp4_rowwise`; one row a thread where BLOCK_V is 32 x
    num_warps); each family's launch says which (BENCHMARKS.md, Decode step)."""
    sk = tl.zeros([BLOCK_V], dtype=tl.float32)
    sq = tl.zeros([BLOCK_V], dtype=tl.float32)
    if read_hi:
        for c in tl.static_range(0, K, BLOCK_K):
            ks = c + tl.arange(0, BLOCK_K)
            s = tl.load(hi_ptr + rows[:, None] * K + ks[None, :], mask=mask_v[:, None] & (ks < K)[None, :], other=0.0)
            sk += tl.sum(s * tl.load(k_ptr + ks, mask=ks < K, other=0.0)[None, :], axis=1)
            sq += tl.sum(s * tl.load(q_ptr + ks, mask=ks < K, other=0.0)[None, :], axis=1)
    else:
        if KIND == NVFP4 and WORDS == 2:  # each thread sums whole rows (`nvfp4_rowwise`)
            sk, sq = nvfp4_rowwise(data_ptr, scale_ptr, rows, mask_v, k_ptr, q_ptr, K, KP)
        elif KIND == NVFP4 and WORDS:  # whole int32 words of 8 codes (`delta.triton_step.nvfp4_partials`)
            for c in tl.static_range(0, KP, BLOCK_K):
                ks = c + tl.arange(0, BLOCK_K)
                pk, pq = nvfp4_partials(data_ptr, scale_ptr, rows, mask_v, tl.load(k_ptr + ks, mask=ks < K, other=0.0),
                                        tl.load(q_ptr + ks, mask=ks < K, other=0.0), c, KP, BLOCK_K)
                sk += tl.sum(pk, axis=1)
                sq += tl.sum(pq, axis=1)
        elif KIND == NVFP4:  # bytes as [BLOCK_V, scale block, 8]: element 2j low nibble, 2j + 1 high nibble
            for c in tl.static_range(0, KP, BLOCK_K):
                blk = c // 16 + tl.arange(0, BLOCK_K // 16)  # [BLOCK_S] scale block
                col = blk[:, None] * 8 + tl.arange(0, 8)[None, :]  # [BLOCK_S, 8] byte column
                m3 = mask_v[:, None, None] & (col < KP // 2)[None, :, :]
                byte = tl.load(data_ptr + rows[:, None, None] * (KP // 2) + col[None, :, :], mask=m3, other=0).to(tl.int32)
                x_even, x_odd = e2m1_f16(byte), e2m1_f16_hi(byte)  # [BLOCK_V, BLOCK_S, 8] elements 2j, 2j+1 * 2^-14
                k_even = tl.load(k_ptr + 2 * col, mask=2 * col < K, other=0.0)[None, :, :]
                k_odd = tl.load(k_ptr + 2 * col + 1, mask=2 * col + 1 < K, other=0.0)[None, :, :]
                q_even = tl.load(q_ptr + 2 * col, mask=2 * col < K, other=0.0)[None, :, :]
                q_odd = tl.load(q_ptr + 2 * col + 1, mask=2 * col + 1 < K, other=0.0)[None, :, :]
                m2 = mask_v[:, None] & (blk < KP // 16)[None, :]
                sc = e4m3_fast(tl.load(scale_ptr + rows[:, None] * (KP // 16) + blk[None, :], mask=m2, other=0))
                sc = sc * E2M1_F16_SCALE  # [BLOCK_V, BLOCK_S]
                sk += tl.sum(tl.sum(x_even * k_even + x_odd * k_odd, axis=2) * sc, axis=1)
                sq += tl.sum(tl.sum(x_even * q_even + x_odd * q_odd, axis=2) * sc, axis=1)
        else:
            for c in tl.static_range(0, K, BLOCK_K):
                ks = c + tl.arange(0, BLOCK_K)
                m2 = mask_v[:, None] & (ks < K)[None, :]
                s = decode_elements(tl.load(data_ptr + rows[:, None] * K + ks[None, :], mask=m2, other=0), KIND)
                sk += tl.sum(s * tl.load(k_ptr + ks, mask=ks < K, other=0.0)[None, :], axis=1)
                sq += tl.sum(s * tl.load(q_ptr + ks, mask=ks < K, other=0.0)[None, :], axis=1)
        sk = scale_rows(sk, gs_ptr, b, bh, rows, mask_v, GROUP)
        sq = scale_rows(sq, gs_ptr, b, bh, rows, mask_v, GROUP)
    return sk, sq


def read_args(packed, fmt, hi):
    """(KIND, GROUP, data, scales, global scale, padded K) of the read copy for the step kernels: the packed encoding
    where they decode it (`packed_codec`: fp32/fp16/bf16, fp8 and int with axis=dstate and scale row, head, tensor
    or none, nvfp4 axis=dstate), else the decoded FP32 copy (or S_hi [B, HV, V, K] itself when there is no read
    copy). Unused pointers are `hi`."""
    dk = hi.shape[-1]
    fp32 = int(Kind.FP32), int(Group.NONE)
    if packed is None:
        return *fp32, hi, hi, hi, dk
    codec = packed_codec(fmt)
    if codec is None:
        return *fp32, fmt.decode(packed).float().contiguous(), hi, hi, dk
    scales, gs = (hi if t is None else t.contiguous() for t in (packed.scales, packed.global_scale))
    return int(codec.kind), int(codec.group), packed.data.contiguous(), scales, gs, codec.padded(dk)


def read_copy_format(config):
    """The format of the copy the step kernels read: the read copy's, or the recurrence copy's when shared."""
    return config.recur_format if config.shared else config.read_format


def decode_step(p: Prepared, q, initial_state, launch_step) -> tuple[torch.Tensor, ReplayState]:
    """One decode token (T = 1) for B sequences at their own phases: one launch of the family's single-token kernel
    through its `launch_replay_step` (`launch_step`).

    Non-flush rows read the packed read copy (ReplayState.lo_packed, written here at every checkpoint; a state
    without one is packed from its decoded read copy, which must round-trip exactly) and the buffer; flush rows read
    S_hi and the buffer, and the folded FP32 state is rounded to both copies (with their error-feedback residuals,
    where the config keeps them) and the read copy packed by `write_checkpoint_packed`. q: the token's q [B, 1, H, K]
    as given. Returns (o [B, 1, HV, V] FP32, ReplayState with lo_packed).
    """
    cfg, st = p.config, p.state
    if p.q.shape[1] != 1:
        raise ValueError(f"decode_step_triton decodes one token: q has T={p.q.shape[1]}, expected 1")
    fmt = read_copy_format(cfg)
    packed = st.lo_packed
    if isinstance(initial_state, torch.Tensor):  # checkpoint 0's packed copy, rounded from zero residuals
        packed = write_read_copy_packed(to_format_layout(initial_state), cfg, p.layer, p.seq_ids, st.checkpoint,
                                        zero_residual(cfg, tuple(st.hi.shape), st.hi.device))[1]
    elif packed is None:
        packed = fmt.encode(st.lo.contiguous())
        if not torch.equal(fmt.decode(packed), st.lo):
            raise ValueError("initial_state has no lo_packed and its read copy does not re-encode exactly; "
                             "start from the FP32 state or a state written by decode_step_triton")
    hi = st.hi.float().contiguous()
    count = st.schedule.count
    new = dict(q=q[:, 0].to(torch.float32), k=p.k_heads[:, 0], v=p.v[:, 0], g=p.g[:, 0], beta=p.beta[:, 0])
    fold = p.plan.fold_after[:, 0]
    read_hi = p.plan.read_hi[:, 0].to(torch.int8) if cfg.speculative is not None else None  # fixed: S_hi at the flush
    u = torch.empty(new["v"].shape, device=hi.device)  # [B, HV, V]
    o = torch.empty_like(u)
    variant = step_variant(fold)
    folds = variant != "none"
    folded = torch.empty_like(hi) if folds else u  # [B, HV, V, K] the FP32 fold of the folding rows
    launch_step(hi, packed, fmt, st.buffer, count, new, read_hi, fold.to(torch.int8), u, o, folded,
                folds=variant, closed=cfg.gdn_fold == "closed", shared=cfg.shared, groups=p.groups,
                eps=cfg.skip_read_below, buf_kind=buffer_kind(cfg))
    buf = {name: t.clone() for name, t in st.buffer.items()}
    rows = torch.arange(p.q.shape[0], device=p.q.device)
    entry = dict(new, u=cfg.round_buffered(u))
    for name, t in buf.items():
        t[rows, count] = entry[name]
    hi_out, lo_out, ckpt = st.hi, st.lo, st.checkpoint.clone()
    if folds:
        idx = fold.nonzero().flatten()
        residual = {copy: t[idx] for copy, t in st.residual.items()}  # the folding rows' error-feedback residuals
        new_hi, new_lo, new_packed = write_checkpoint_packed(folded[idx], cfg, p.layer, p.seq_ids[idx], ckpt[idx] + 1,
                                                             residual)
        for copy, t in residual.items():
            st.residual[copy][idx] = t  # the call's own copies (`prepare`)
        hi_out = hi_out.clone()
        hi_out[idx] = new_hi
        lo_out = hi_out if cfg.shared else lo_out.clone()
        if not cfg.shared:
            lo_out[idx] = new_lo
        packed = _assign_packed(packed, idx, new_packed)
        ckpt[idx] += 1
        for t in buf.values():
            t[idx] = 0
    state = ReplayState(hi=hi_out, lo=lo_out, buffer=buf, schedule=p.schedule_after, checkpoint=ckpt,
                        seq_ids=p.seq_ids, layer=p.layer, lo_packed=packed, residual=st.residual)
    return o[:, None], state


def _assign_packed(packed, idx, new):
    """packed with the sequences idx replaced by `new` (all fields lead with the batch dim)."""
    fields = {}
    for name in packed.FIELDS:
        old, rep = getattr(packed, name), getattr(new, name)
        if old is not None:
            old = old.clone()
            old[idx] = rep
        fields[name] = old
    return type(packed)(packed.format, packed.shape, **fields)


def verify(p: Prepared, q, verify_triton) -> torch.Tensor:
    """Output-only verification of the call's T drafts appended after the committed entries of p's state, each
    sequence reading S_hi if `state.schedule.step_read_hi` else the read copy (as `speculative_decode_reference`),
    through the family's `verify_triton`. q: the drafts' q [B, T, H, K] as given. Returns o [B, T, HV, V] FP32."""
    cfg, st = p.config, p.state
    fmt = read_copy_format(cfg)
    packed = st.lo_packed if st.lo_packed is not None else fmt.encode(st.lo.contiguous())
    drafts = dict(q=q.to(torch.float32), k=p.k_heads, v=p.v, g=p.g, beta=p.beta)
    width = torch.full((q.shape[0],), q.shape[1], dtype=torch.int64, device=q.device)
    _, o = verify_triton(st.hi, packed, fmt, st.buffer, st.schedule.count, drafts, width, st.schedule.step_read_hi,
                         p.groups, cfg.skip_read_below)
    return o


def conventional_launch(kernel, q, k, v, g, beta, state, block_v, num_warps):
    """Launch the family's `_conventional_step_kernel` (one eager FP32 step, state [B, HV, V, K] updated in place)
    after checking every tensor is FP32 and contiguous; returns o [B, HV, V]."""
    batch, nv, dv, dk = state.shape
    groups = nv // q.shape[1]
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("state", state)):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 tensor, got {t.dtype} (contiguous={t.is_contiguous()})")
    o = torch.empty_like(v)
    grid = (batch, nv, triton.cdiv(dv, block_v))
    kernel[grid](q, k, v, g, beta, state, o, nv, groups, dk, dv, BK=triton.next_power_of_2(dk), BV=block_v, num_warps=num_warps)
    return o

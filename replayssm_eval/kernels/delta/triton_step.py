"""Triton pieces of the decode kernels shared by the delta-rule families (gdn: scalar decay, kda: per-channel decay).

- the packed read copy's tile in the step kernels (`_decode_codes`, `_load_packed`) and its launch
  arguments (`_read_args`);
- the single-token step and verification in the `KernelFamily` call convention (`decode_step`,
  `verify`), around each family's launcher, and the conventional step's launch (`conventional_launch`).
The chunked kernels' shared pieces are `triton_chunk`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_eval.kernels.delta._common import Prepared, to_format_layout
from replayssm_eval.quant.formats import ElementwiseFormat, FP8Format, NVFP4Format
from replayssm_eval.quant.triton import _e4m3_fast, _e5m2_fast, e2m1_decode, e4m3_decode, triton_rounds
from replayssm_eval.replay.buffer_round import buffer_kind
from replayssm_eval.replay.state import ReplayState, write_checkpoint_packed

# packed read-copy kinds of the step kernel
_P_F32, _P_F16, _P_BF16, _P_E4M3, _P_E5M2, _P_NVFP4 = map(tl.constexpr, range(6))
_S_NONE, _S_ROW, _S_HEAD, _S_TENSOR = map(tl.constexpr, range(4))


@triton.jit
def _decode_codes(raw, KIND: tl.constexpr):
    """FP32 values of one-byte or 16/32-bit read-copy elements (E4M3, E5M2 through FP16 bit patterns; others cast)."""
    if KIND == _P_E4M3:
        x = _e4m3_fast(raw)
    elif KIND == _P_E5M2:
        x = _e5m2_fast(raw)
    else:
        x = raw.to(tl.float32)
    return x


@triton.jit
def _load_packed(data_ptr, scales_ptr, gs_ptr, b, hv, vs, ks, HV, V, K, KP,
                 KIND: tl.constexpr, SCALE: tl.constexpr):
    """Decode the read copy's tile [BK, BV] (k, v) of (b, hv) from its packed encoding."""
    mask = (ks[:, None] < K) & (vs[None, :] < V)
    rowid = (b * HV + hv) * V + vs[None, :]  # format row (b, hv, v)
    if KIND == _P_NVFP4:
        byte = tl.load(data_ptr + rowid.to(tl.int64) * (KP // 2) + ks[:, None] // 2, mask=mask, other=0).to(tl.int32)
        nib = tl.where(ks[:, None] % 2 == 0, byte & 0xF, byte >> 4)
        sb = tl.load(scales_ptr + rowid.to(tl.int64) * (KP // 16) + ks[:, None] // 16, mask=mask, other=0)
        x = (e2m1_decode(nib) * e4m3_decode(sb))
    else:
        x = _decode_codes(tl.load(data_ptr + rowid.to(tl.int64) * K + ks[:, None], mask=mask, other=0), KIND)
    if SCALE == _S_ROW:
        x = x * tl.load(gs_ptr + rowid, mask=vs[None, :] < V, other=1.0)
    elif SCALE == _S_HEAD:
        x = x * tl.load(gs_ptr + b * HV + hv)
    elif SCALE == _S_TENSOR:
        x = x * tl.load(gs_ptr + b)
    return tl.where(mask, x, 0.0)


def _read_args(packed, fmt, hi):
    """(kind, scale group, data, scales, global scale, padded K) of the read copy for the step kernels: the packed
    encoding where they decode it (fp32/fp16/bf16, fp8 any scale, nvfp4 axis=dstate), else the decoded FP32 copy
    (or S_hi [B, HV, V, K] itself when there is no read copy). Unused pointers are `hi`."""
    dk = hi.shape[-1]
    kinds = {"fp32": _P_F32.value, "fp16": _P_F16.value, "fp16sr": _P_F16.value, "bf16": _P_BF16.value}
    groups = {"none": _S_NONE.value, "row": _S_ROW.value, "head": _S_HEAD.value, "tensor": _S_TENSOR.value}
    if packed is None:
        return _P_F32.value, _S_NONE.value, hi, hi, hi, dk
    if not triton_rounds(fmt):
        return _P_F32.value, _S_NONE.value, fmt.decode(packed).float().contiguous(), hi, hi, dk
    gs = hi if packed.global_scale is None else packed.global_scale.contiguous()
    if isinstance(fmt, ElementwiseFormat):
        return kinds[fmt.base], _S_NONE.value, packed.data.contiguous(), hi, hi, dk
    if isinstance(fmt, FP8Format):
        kind = (_P_E5M2 if fmt.base == "fp8e5m2" else _P_E4M3).value
        return kind, groups[fmt.scale], packed.data.contiguous(), hi, gs, dk
    if isinstance(fmt, NVFP4Format) and fmt.axis == "dstate":
        return _P_NVFP4.value, groups[fmt.scale], packed.data.contiguous(), packed.scales.contiguous(), gs, packed.data.shape[-1] * 2
    return _P_F32.value, _S_NONE.value, fmt.decode(packed).float().contiguous(), hi, hi, dk


def read_copy_format(config):
    return config.recur_format if config.shared else config.read_format


def decode_step(p: Prepared, q, initial_state, launch_step) -> tuple[torch.Tensor, ReplayState]:
    """One decode token (T = 1) for B sequences at their own phases: one launch of the family's single-token kernel
    through its `launch_replay_step` (`launch_step`).

    Non-flush rows read the packed read copy (ReplayState.lo_packed, written here at every checkpoint; a state
    without one is packed from its decoded read copy, which must round-trip exactly) and the buffer; flush rows read
    S_hi and the buffer, and the folded FP32 state is rounded to both copies and the read copy packed by
    `write_checkpoint_packed`. q: the token's q [B, 1, H, K] as given. Returns (o [B, 1, HV, V] FP32, ReplayState
    with lo_packed).
    """
    cfg, st = p.config, p.state
    if p.q.shape[1] != 1:
        raise ValueError(f"decode_step_triton decodes one token: q has T={p.q.shape[1]}, expected 1")
    fmt = read_copy_format(cfg)
    packed = st.lo_packed
    if isinstance(initial_state, torch.Tensor):
        packed = write_checkpoint_packed(to_format_layout(initial_state), cfg, p.layer, p.seq_ids, st.checkpoint)[2]
    elif packed is None:
        packed = fmt.encode(st.lo.contiguous())
        if not torch.equal(fmt.decode(packed), st.lo):
            raise ValueError("initial_state has no lo_packed and its read copy does not re-encode exactly; "
                             "start from the FP32 state or a state written by decode_step_triton")
    hi = st.hi.float().contiguous()
    count = st.schedule.count
    new = dict(q=q[:, 0].to(torch.float32), k=p.k_heads[:, 0], v=p.v[:, 0], g=p.g[:, 0], beta=p.beta[:, 0])
    fold, read_hi = p.plan.fold_after[:, 0], p.plan.read_hi[:, 0]
    u = torch.empty(new["v"].shape, device=hi.device)  # [B, HV, V]
    o = torch.empty_like(u)
    folds = bool(fold.any())
    folded = torch.empty_like(hi) if folds else u  # [B, HV, V, K] the FP32 fold of the folding rows
    launch_step(hi, packed, fmt, st.buffer, count, new, read_hi.to(torch.int8), fold.to(torch.int8), u, o, folded,
                folds=folds, closed=cfg.gdn_fold == "closed", groups=p.groups, eps=cfg.skip_read_below,
                buf_kind=buffer_kind(cfg))
    buf = {name: t.clone() for name, t in st.buffer.items()}
    rows = torch.arange(p.q.shape[0], device=p.q.device)
    entry = dict(new, u=cfg.round_buffered(u))
    for name, t in buf.items():
        t[rows, count] = entry[name]
    hi_out, lo_out, ckpt = st.hi, st.lo, st.checkpoint.clone()
    if folds:
        idx = fold.nonzero().flatten()
        new_hi, new_lo, new_packed = write_checkpoint_packed(folded[idx], cfg, p.layer, p.seq_ids[idx], ckpt[idx] + 1)
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
                        seq_ids=p.seq_ids, layer=p.layer, lo_packed=packed)
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

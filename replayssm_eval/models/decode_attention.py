"""Decode attention over a static KV cache: one query token per row, reading only the columns its mask opens.

Hugging Face's SDPA over a `StaticCache` attends over every column of the cache ([B, H_kv, max_len, D]) at every step,
written or not, with a boolean mask closing the unwritten ones and a left-padded row's padding; a decoder sized for a
long generation pays its last step's attention from its first. Here (flash decoding) one program per (row, KV head,
split) walks the row's open span (its first to its last open column, from the mask), split evenly between the
row's programs, in blocks of BLOCK_N columns: the scores of the KV head's G query heads together (grouped-query
attention), the mask applied inside the span, an online softmax in FP32, the probabilities cast to V's dtype for
the product (as flash attention does). A second kernel combines the splits. A column outside every row's span costs
nothing, so a step's attention reads what is written, whatever the cache's size.

    out = decode_attention(q, k, v, mask, scaling)     # q [B, H, 1, D]; k, v [B, H_kv, T, D]; mask [B, T] bool

`attention_forward` is the Hugging Face attention function that uses it (`use_decode_attention` registers it as ATTENTION
and sets it on a model): decode attention where a one-token query has a boolean mask on CUDA, HF's SDPA everywhere else
(prefill, no mask, CPU), so those paths keep their bits. Its sums run in another order than SDPA's: outputs agree
with SDPA to the inputs' precision, not bit for bit (tests/models/test_decode_attention.py).
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "replayssm_decode"
DEVICES = ("cuda",)  # where attention_forward runs the kernel (the tests add "cpu": the Triton interpreter)


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, span_ptr, m_ptr, l_ptr, acc_ptr,  # q [B, H, D]; k, v [B, H_kv, T, D]; mask [B, T]; span [B, 2]; m, l [B, H_kv, SPLITS, BLOCK_G]; acc [.., BLOCK_G, D]
    H_KV, T, D, G, scaling,
    SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    bh, split = tl.program_id(0), tl.program_id(1)
    b, h = bh // H_KV, bh % H_KV
    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    q = tl.load(q_ptr + ((b * H_KV + h) * G + offs_g[:, None]).to(tl.int64) * D + offs_d[None, :],
                mask=(offs_g < G)[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_G, BLOCK_D]
    if UPCAST:
        q = q.to(tl.float32)
    first = tl.load(span_ptr + 2 * b)
    last = tl.load(span_ptr + 2 * b + 1)  # the row's open span [first, last)
    chunk = tl.cdiv(tl.cdiv(last - first, SPLITS), BLOCK_N) * BLOCK_N
    start = first + split * chunk
    end = tl.minimum(start + chunk, last)
    kv = bh.to(tl.int64) * T * D  # the (row, KV head) block of k and v
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    n = start
    while n < end:  # a while loop: the interpreter cannot take range() of a loaded scalar
        cols = n + offs_n
        live = cols < end
        opened = tl.load(mask_ptr + b.to(tl.int64) * T + cols, mask=live, other=0) != 0  # [BLOCK_N]
        tile = kv + cols[:, None].to(tl.int64) * D + offs_d[None, :]
        k = tl.load(k_ptr + tile, mask=live[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(v_ptr + tile, mask=live[:, None] & mask_d[None, :], other=0.0)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scaling  # [BLOCK_G, BLOCK_N]
        s = tl.where(opened[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block with no open column adds nothing
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
        n += BLOCK_N
    out = (bh * SPLITS + split) * BLOCK_G + offs_g
    tl.store(m_ptr + out, m_i)
    tl.store(l_ptr + out, l_i)
    tl.store(acc_ptr + out[:, None].to(tl.int64) * BLOCK_D + offs_d[None, :], acc)


@triton.jit
def _combine_kernel(
    m_ptr, l_ptr, acc_ptr, o_ptr,  # the splits' m, l [B, H_kv, SPLITS, BLOCK_G], acc [.., BLOCK_D]; o [B, H, D]
    G, D,
    SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
):
    bh = tl.program_id(0)
    offs_s = tl.arange(0, SPLITS)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    part = (bh * SPLITS + offs_s[:, None]) * BLOCK_G + offs_g[None, :]  # [SPLITS, BLOCK_G]
    m = tl.load(m_ptr + part)
    l = tl.load(l_ptr + part)
    top = tl.max(m, axis=0)  # [BLOCK_G]
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - tl.where(top == float("-inf"), 0.0, top)[None, :]))
    acc = tl.load(acc_ptr + part[:, :, None].to(tl.int64) * BLOCK_D + offs_d[None, None, :])  # [SPLITS, BLOCK_G, BLOCK_D]
    num = tl.sum(acc * w[:, :, None], axis=0)  # [BLOCK_G, BLOCK_D]
    den = tl.sum(l * w, axis=0)
    o = num / tl.where(den == 0.0, 1.0, den)[:, None]  # a row with no open column: zeros
    rows = bh * G + offs_g
    tl.store(o_ptr + rows[:, None].to(tl.int64) * D + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=(offs_g < G)[:, None] & (offs_d < D)[None, :])


def open_spans(mask: torch.Tensor) -> torch.Tensor:
    """[B, 2] int32 (first open column, last open column + 1) of each row of mask [B, T] (bool); (0, 0) for a row with
    none. On the device, without a host read (a CUDA graph captures it)."""
    T = mask.shape[-1]
    cols = torch.arange(T, device=mask.device, dtype=torch.int32)
    first = torch.where(mask, cols, T).amin(-1)
    last = torch.where(mask, cols + 1, 0).amax(-1)
    return torch.stack([torch.minimum(first, last), last], -1).to(torch.int32).contiguous()


def decode_launch_config(batch: int, kv_heads: int, length: int, head_dim: int) -> dict:
    """SPLITS, BLOCK_N, num_warps and num_stages of `decode_attention`: enough programs to fill an H200 (132 SMs) twice
    over at small batches, one split per (row, KV head) at serving batches; blocks of 64 columns at head_dim 256 and
    32 below, 4 warps (the best of benchmarks/decode_attention_speed.py's sweeps on both 4B presets' geometries at
    batches 64 and 256, BENCHMARKS.md)."""
    block_n = 64 if head_dim > 128 else 32
    splits = max(1, min(triton.cdiv(264, batch * kv_heads), triton.cdiv(length, 4 * block_n), 64))
    return {"SPLITS": triton.next_power_of_2(splits), "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2}


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float,
                     launch: dict | None = None) -> torch.Tensor:
    """Attention of one query token per row over the columns its mask opens.

    q [B, H, 1, D]; k, v [B, H_kv, T, D] (H a multiple of H_kv: query head h reads KV head h // (H / H_kv)); mask
    [B, T] bool (True = attend); scaling: the scores' factor. Returns [B, 1, H, D] in q's dtype (Hugging Face's
    attention output layout); a row with no open column gets zeros. launch: `decode_launch_config`'s keys."""
    batch, heads, length, dim = q.shape
    kv_heads, T = k.shape[1], k.shape[2]
    if length != 1:
        raise ValueError(f"decode_attention takes one query token per row, got {length}")
    if heads % kv_heads or v.shape != k.shape or k.shape[0] != batch or k.shape[3] != dim:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected q [B, H, 1, D], "
                         "k and v [B, H_kv, T, D] with H a multiple of H_kv")
    if mask.dtype != torch.bool or tuple(mask.shape) != (batch, T):
        raise ValueError(f"mask must be bool [B, T] = [{batch}, {T}], got {mask.dtype} {tuple(mask.shape)}")
    cfg = launch or decode_launch_config(batch, kv_heads, T, dim)
    splits, group = cfg["SPLITS"], heads // kv_heads
    block_g, block_d = max(16, triton.next_power_of_2(group)), triton.next_power_of_2(dim)
    m = torch.empty(batch, kv_heads, splits, block_g, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty(*m.shape, block_d, device=q.device, dtype=torch.float32)
    out = torch.empty(batch, 1, heads, dim, device=q.device, dtype=q.dtype)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # FP32 inputs in FP32 FMAs, not TF32
    upcast = q.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"  # its bf16 tl.dot is wrong
    # Triton launches on the current device: a layer that a device map put on another GPU runs there
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _split_kernel[(batch * kv_heads, splits)](
            q.contiguous(), k.contiguous(), v.contiguous(), mask.contiguous(), open_spans(mask), m, l, acc,
            kv_heads, T, dim, group, float(scaling),
            SPLITS=splits, BLOCK_G=block_g, BLOCK_N=cfg["BLOCK_N"], BLOCK_D=block_d, PRECISION=precision,
            UPCAST=upcast, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
        _combine_kernel[(batch * kv_heads,)](m, l, acc, out, group, dim, SPLITS=splits, BLOCK_G=block_g,
                                             BLOCK_D=block_d)
    return out


def takes_decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                           kwargs: dict) -> bool:
    """Whether `attention_forward` runs `decode_attention`: a one-token query on CUDA, keys and values of one shape
    and the query's head_dim (not multi-head latent attention's), a boolean mask [B, 1, 1, T] over their T columns (a
    static cache's, or a padded batch's), and none of the options it does not implement."""
    return (query.device.type in DEVICES and query.shape[2] == 1 and key.shape == value.shape
            and query.shape[-1] == key.shape[-1] and query.shape[1] % key.shape[1] == 0
            and isinstance(attention_mask, torch.Tensor)
            and attention_mask.dtype == torch.bool and attention_mask.dim() == 4 and attention_mask.shape[1:3] == (1, 1)
            and attention_mask.shape[-1] == key.shape[2]
            and not any(kwargs.get(name) is not None for name in ("sliding_window", "softcap", "s_aux"))
            and not kwargs.get("output_attentions", False))


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs):
    """Hugging Face's attention-function signature: `decode_attention` where `takes_decode_attention`, else SDPA's."""
    if dropout == 0.0 and takes_decode_attention(query, key, value, attention_mask, kwargs):
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        mask = attention_mask[:, 0, 0].expand(query.shape[0], key.shape[2])
        return decode_attention(query, key, value, mask, scale), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def use_decode_attention(model, on: bool = True) -> None:
    """Set `attention_forward` as the attention of `model` (and its sub-models) where it runs SDPA, registered with
    SDPA's masks; on=False sets SDPA back. A model whose attention cannot be set after loading (one that does not
    call its attention through Hugging Face's AttentionInterface) keeps its own."""
    # modeling_utils is imported once a model exists; importing it earlier (with this module) prints torchao's noise
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION, attention_forward)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    now, want = (("sdpa", ATTENTION) if on else (ATTENTION, "sdpa"))
    settable = getattr(model, "_can_set_attn_implementation", lambda: False)()
    if settable and model.config._attn_implementation == now:
        model.set_attn_implementation(want)

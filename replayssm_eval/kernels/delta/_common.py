"""Argument checks, state layout and the call setup shared by every delta-rule backend (one `prepare_inputs()`).

The delta-rule families differ only in the shape of the log-decay g: Gated DeltaNet has one per
value head (g [B, T, HV], `per_channel=False`), Kimi Delta Attention one per key channel
(g [B, T, HV, K], `per_channel=True`, exp(g_t) scales the rows of S).

State layout. The math uses the Hugging Face layout S [B, HV, K, V] (o_t = S_t^T q_t). The
formats see a state as [..., heads, head_dim, d_state], and value dim V plays head_dim and key
dim K plays d_state, so every stored copy (ReplayState.hi / .lo, write_checkpoint, the
Philox element offsets, the packed read copy) is the transpose [B, HV, V, K]: NVFP4 blocks along
`dstate` run along K, FP8 row scales are per (head, v) row. `to_format_layout` /
`from_format_layout` are the only places that transpose; `checkpoint_kv` gives a ReplayState's
copies back as [B, HV, K, V].

Buffer (ReplayState.buffer), each [B, capacity, ...], entries [0, schedule.count[b]) valid and
the rest zero:
    k     [B, cap, H, K]   key of each entry (key heads, as given)
    u     [B, cap, HV, V]  corrected value u_i, as computed at its own step from the copy it read
    g     [B, cap, HV]     log-decay ([B, cap, HV, K] per channel)
    v     [B, cap, HV, V]  raw value      (closed fold only)
    beta  [B, cap, HV]     write strength (closed fold only)
capacity = window, plus the drafts per step for a speculative schedule (the ring of L + T).

Decay skip (`#skip=EPS`). The checkpoint term is dropped where the cumulative decay since the
checkpoint is below EPS; with a per-channel decay only when every channel is, i.e. when
max_k exp(gc_k) < EPS (`keep_checkpoint`), so the dropped term is bounded by EPS |S_src| in every
channel as for the scalar decay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.host_values import known_nonpositive, largest, same_values
from replayssm_eval.replay.schedule import ScheduleState, TokenPlan, plan_tokens
from replayssm_eval.replay.state import ReplayState, check_residual, write_checkpoint, zero_residual
from replayssm_eval.kernels.validate import check_tensor

COMPUTE_DTYPES = (torch.float32, torch.float64)
OPEN_KEYS = ("k", "u", "g")
CLOSED_KEYS = ("k", "u", "g", "v", "beta")


def to_format_layout(state_kv: torch.Tensor) -> torch.Tensor:
    """[B, HV, K, V] -> [B, HV, V, K] (the formats' [B, H, P, N])."""
    return state_kv.transpose(-1, -2)


def from_format_layout(state_vk: torch.Tensor) -> torch.Tensor:
    """[B, HV, V, K] -> [B, HV, K, V]."""
    return state_vk.transpose(-1, -2)


def checkpoint_kv(state: ReplayState) -> tuple[torch.Tensor, torch.Tensor]:
    """(S_hi, S_lo) of a delta-rule ReplayState as [B, HV, K, V] views (stored as [B, HV, V, K])."""
    return from_format_layout(state.hi), from_format_layout(state.lo)


def keep_checkpoint(g_cum: torch.Tensor, eps: float | None, per_channel: bool) -> torch.Tensor:
    """1 where the checkpoint term is read, 0 where the cumulative decay is below eps.

    g_cum: the log of the decay since the checkpoint, [...] (scalar decay: the result has its shape) or [..., K]
    (per channel: the result is [...], 0 only where every channel is below eps)."""
    if per_channel:
        if eps is None:
            return torch.ones_like(g_cum[..., 0])
        return (torch.exp(g_cum.amax(-1)) >= eps).to(g_cum.dtype)
    if eps is None:
        return torch.ones_like(g_cum)
    return (torch.exp(g_cum) >= eps).to(g_cum.dtype)


def buffer_capacity(config: ReplayConfig) -> int:
    return config.window + (config.speculative.drafts if config.speculative is not None else 0)


def buffer_keys(config: ReplayConfig) -> tuple[str, ...]:
    return CLOSED_KEYS if config.gdn_fold == "closed" else OPEN_KEYS


def expand_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Key heads [..., H, D] -> value heads [..., HV, D]: value head hv uses key head hv // groups."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=-2)


@dataclass
class Prepared:
    """One call, checked and set up. Inputs in the compute dtype; q and k expanded to value heads."""

    q: torch.Tensor  # [B, T, HV, K]
    k: torch.Tensor  # [B, T, HV, K]
    k_heads: torch.Tensor  # [B, T, H, K] (what the buffer stores)
    v: torch.Tensor  # [B, T, HV, V]
    g: torch.Tensor  # [B, T, HV] or, per channel, [B, T, HV, K]
    beta: torch.Tensor  # [B, T, HV]
    config: ReplayConfig
    layer: int
    seq_ids: torch.Tensor  # [B] int64
    dtype: torch.dtype
    groups: int
    per_channel: bool  # g is [B, T, HV, K]
    state: ReplayState  # at call start: fresh tensors, buffer in the compute dtype, hi / lo fp32
    plan: TokenPlan
    schedule_after: ScheduleState

    @property
    def capacity(self) -> int:
        return buffer_capacity(self.config)


def _check_config(config) -> ReplayConfig:
    if isinstance(config, str):
        return ReplayConfig.parse(config).plain()
    if not isinstance(config, ReplayConfig):
        raise ValueError(f"config must be a ReplayConfig or its string form (e.g. 'nvfp4/fp16sr@16'), got {type(config).__name__}")
    return config.plain()


def prepare_inputs(q, k, v, g, beta, initial_state, config, *, layer_idx, seq_ids, compute_dtype, per_channel) -> Prepared:
    """Check every argument (ValueError naming it and the expected value) and set up the call.

    per_channel: g is [B, T, HV, K] (one log-decay per key channel, checked <= 0) instead of [B, T, HV]."""
    config = _check_config(config)
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be torch.float32 or torch.float64, got {compute_dtype}")
    if not isinstance(layer_idx, int) or layer_idx < 0:
        raise ValueError(f"layer_idx must be an int >= 0, got {layer_idx!r}")
    check_tensor("q", q, (None, None, None, None))
    device = q.device
    bsz, seqlen, nk, dk = q.shape
    check_tensor("k", k, (bsz, seqlen, nk, dk), device=device)
    check_tensor("v", v, (bsz, seqlen, None, None), device=device)
    nv, dv = v.shape[2], v.shape[3]
    if nv % nk:
        raise ValueError(f"v has {nv} value heads, expected a multiple of the {nk} key heads of q and k")
    check_tensor("g", g, (bsz, seqlen, nv, dk) if per_channel else (bsz, seqlen, nv), device=device)
    if per_channel and g.numel() and not known_nonpositive(g) and float(g.max()) > 0:  # a device read, unless vouched
        raise ValueError(f"g is a log-decay and must be <= 0, got a maximum of {float(g.max()):g}")
    check_tensor("beta", beta, (bsz, seqlen, nv), device=device)

    if seq_ids is None:
        seq_ids = initial_state.seq_ids if isinstance(initial_state, ReplayState) else torch.arange(bsz, device=device)
    check_tensor("seq_ids", seq_ids, (bsz,), device=device, dtypes=(torch.int64, torch.int32))
    seq_ids = seq_ids.to(torch.int64)

    keys = buffer_keys(config)
    cap = buffer_capacity(config)
    if isinstance(initial_state, ReplayState):
        state = _continue_state(
            initial_state, config, layer_idx, seq_ids, _entry_shapes(nk, nv, dk, dv, per_channel), keys, cap, device, compute_dtype,
        )
    elif isinstance(initial_state, torch.Tensor):
        check_tensor("initial_state", initial_state, (bsz, nv, dk, dv), device=device)
        checkpoint = torch.zeros(bsz, dtype=torch.int64, device=device)
        residual = zero_residual(config, (bsz, nv, dv, dk), device)
        hi, lo = write_checkpoint(to_format_layout(initial_state), config, layer_idx, seq_ids, checkpoint, residual)
        state = ReplayState(
            hi=hi, lo=lo, buffer=empty_buffer(keys, bsz, cap, nk, nv, dk, dv, device, compute_dtype, per_channel),
            schedule=ScheduleState.start(bsz, device=device), checkpoint=checkpoint, seq_ids=seq_ids, layer=layer_idx,
            residual=residual,
        )
    else:
        raise ValueError(
            f"initial_state must be the FP32 state [B, HV, K, V] = [{bsz}, {nv}, {dk}, {dv}] or a ReplayState, "
            f"got {type(initial_state).__name__}"
        )

    plan, after = plan_tokens(config, state.schedule, seqlen, seq_ids)
    groups = nv // nk
    cd = compute_dtype
    # buffered inputs in the buffer dtype, as vLLM's GDN ring keeps k in the activation dtype and beta is
    # computed in its input dtype (vllm-project/vllm#48792); the closed fold also buffers v
    rounded = config.round_buffered
    k = rounded(k.to(cd))
    v = rounded(v.to(cd)) if config.gdn_fold == "closed" else v.to(cd)
    return Prepared(
        q=expand_heads(q.to(cd), groups), k=expand_heads(k, groups), k_heads=k, v=v,
        g=g.to(cd), beta=rounded(beta.to(cd)), config=config, layer=layer_idx, seq_ids=seq_ids, dtype=cd, groups=groups,
        per_channel=per_channel, state=state, plan=plan, schedule_after=after,
    )


def _entry_shapes(nk, nv, dk, dv, per_channel) -> dict[str, tuple[int, ...]]:
    return {"k": (nk, dk), "u": (nv, dv), "g": (nv, dk) if per_channel else (nv,), "v": (nv, dv), "beta": (nv,)}


def empty_buffer(keys, bsz, cap, nk, nv, dk, dv, device, dtype, per_channel) -> dict[str, torch.Tensor]:
    shapes = _entry_shapes(nk, nv, dk, dv, per_channel)
    return {name: torch.zeros(bsz, cap, *shapes[name], device=device, dtype=dtype) for name in keys}


def _continue_state(state, config, layer, seq_ids, shapes, keys, cap, device, dtype) -> ReplayState:
    bsz = seq_ids.shape[0]
    (nv, dv), (_, dk) = shapes["u"], shapes["k"]
    check_tensor("initial_state.hi", state.hi, (bsz, nv, dv, dk), device=device)
    check_tensor("initial_state.lo", state.lo, (bsz, nv, dv, dk), device=device)
    if state.layer != layer:
        raise ValueError(f"initial_state belongs to layer {state.layer}, expected layer_idx={layer}")
    check_residual(state, config, (bsz, nv, dv, dk), device)
    if not same_values(state.seq_ids.to(device=device, dtype=torch.int64), seq_ids):
        raise ValueError(f"seq_ids {seq_ids.tolist()} differ from initial_state.seq_ids {state.seq_ids.tolist()}")
    buffer = {}
    for name in keys:
        if name not in state.buffer:
            raise ValueError(
                f"initial_state.buffer has no {name!r} entry; a {config.gdn_fold} fold needs {', '.join(keys)}"
            )
        check_tensor(f"initial_state.buffer[{name!r}]", state.buffer[name], (bsz, cap, *shapes[name]), device=device)
        buffer[name] = state.buffer[name].to(dtype).clone()
    if largest(state.schedule.count) > cap:
        raise ValueError(f"initial_state.schedule.count exceeds the buffer capacity {cap}")
    hi = state.hi.float().clone()
    return ReplayState(
        hi=hi, lo=hi if config.shared else state.lo.float().clone(), buffer=buffer, schedule=state.schedule,
        checkpoint=state.checkpoint.clone(), seq_ids=seq_ids, layer=layer, lo_packed=state.lo_packed,
        residual={copy: t.clone() for copy, t in state.residual.items()},
    )

"""Argument preparation shared by the Mamba-2 reference, chunked and Triton paths: one `prepare_inputs()`.

It checks every argument (errors name the argument and the expected value), casts the inputs to
the compute dtype, and turns `initial_state` into a `ReplayState` with a buffer of the capacity
the config needs: an FP32 state at the anchor gets checkpoint 0 written by `write_checkpoint`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from replayssm_eval.formats import PackedState
from replayssm_eval.kernels.validate import check_tensor
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.host_values import largest, same_values
from replayssm_eval.replay.schedule import ScheduleState
from replayssm_eval.replay.state import ReplayState, check_residual, write_checkpoint_packed, zero_residual

COMPUTE_DTYPES = (torch.float32, torch.float64)
BUFFER_KEYS = ("x", "B", "dt")


@dataclass
class Inputs:
    """Checked inputs in the compute dtype; `state` holds checkpoints in FP32 and the buffer in the compute dtype.

    x and B are the buffered values, rounded to the config's buffer dtype; x_skip is x as given, for the D x term.
    """

    x: torch.Tensor  # [B, T, H, P]
    dt: torch.Tensor  # [B, T, H]
    A: torch.Tensor  # [H]
    B: torch.Tensor  # [B, T, G, N]
    C: torch.Tensor  # [B, T, G, N]
    D: torch.Tensor  # [H]
    x_skip: torch.Tensor  # [B, T, H, P]
    state: ReplayState
    config: ReplayConfig
    out_dtype: torch.dtype

    @property
    def dims(self) -> tuple[int, int, int, int, int, int]:
        """(batch, tokens, heads, head_dim, groups, d_state)."""
        batch, tokens, heads, head_dim = self.x.shape
        return batch, tokens, heads, head_dim, self.B.shape[2], self.B.shape[3]

    @property
    def capacity(self) -> int:
        return self.state.buffer["x"].shape[1]


def buffer_capacity(config: ReplayConfig) -> int:
    """Ring capacity: the window, plus the drafts of one step when speculative (L + T)."""
    return config.window + (config.speculative.drafts if config.speculative is not None else 0)


def group_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., G, N] -> [..., H, N]: head h uses group h // (H // G)."""
    return t.repeat_interleave(heads // t.shape[-2], dim=-2)


def parse_config(config) -> ReplayConfig:
    if isinstance(config, ReplayConfig):
        return config.plain()
    if isinstance(config, str):
        return ReplayConfig.parse(config).plain()
    raise ValueError(f"config must be a ReplayConfig or its string form (e.g. 'nvfp4/fp16sr@16'), got {type(config).__name__}")


def merge_packed(old: PackedState | None, new: PackedState, rows: torch.Tensor, batch: int) -> PackedState | None:
    """`old` with the sequences `rows` replaced by `new` (every field of a PackedState leads with the batch dim)."""
    if len(rows) == batch:
        order = torch.empty_like(rows)
        order[rows] = torch.arange(batch, device=rows.device)
        return PackedState(new.format, (batch, *new.shape[1:]),
                           *(None if t is None else t[order] for t in new.tensors()))
    if old is None:
        return None
    fields = []
    for o, n in zip(old.tensors(), new.tensors()):
        if o is not None:
            o = o.clone()
            o[rows] = n
        fields.append(o)
    return PackedState(old.format, old.shape, *fields)


def prepare_inputs(x, dt, A, B, C, D, initial_state, config, layer_idx, seq_ids, compute_dtype) -> Inputs:
    config = parse_config(config)
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be torch.float32 or torch.float64, got {compute_dtype}")
    check_tensor("x", x, (None, None, None, None))
    batch, tokens, heads, head_dim = x.shape
    device = x.device
    check_tensor("dt", dt, (batch, tokens, heads), device=device)
    check_tensor("A", A, (heads,), device=device)
    check_tensor("B", B, (batch, tokens, None, None), device=device)
    groups, d_state = B.shape[2], B.shape[3]
    if groups == 0 or heads % groups:
        raise ValueError(f"B has {groups} groups, expected a divisor of the {heads} heads of x")
    check_tensor("C", C, (batch, tokens, groups, d_state), device=device)
    check_tensor("D", D, (heads,), device=device)
    if not isinstance(layer_idx, int) or layer_idx < 0:
        raise ValueError(f"layer_idx must be an int >= 0, got {layer_idx!r}")

    if isinstance(initial_state, ReplayState):
        state = _check_replay_state(initial_state, config, layer_idx, seq_ids,
                                    (batch, heads, head_dim, groups, d_state), device, compute_dtype)
    else:
        check_tensor("initial_state", initial_state, (batch, heads, head_dim, d_state), device=device)
        seq_ids = _seq_ids(seq_ids, batch, device)
        checkpoint = torch.zeros(batch, dtype=torch.int64, device=device)
        residual = zero_residual(config, tuple(initial_state.shape), device)
        hi, lo, packed = write_checkpoint_packed(initial_state.float(), config, layer_idx, seq_ids, checkpoint, residual)
        capacity = buffer_capacity(config)
        buffer = {
            "x": torch.zeros(batch, capacity, heads, head_dim, dtype=compute_dtype, device=device),
            "B": torch.zeros(batch, capacity, groups, d_state, dtype=compute_dtype, device=device),
            "dt": torch.zeros(batch, capacity, heads, dtype=compute_dtype, device=device),
        }
        state = ReplayState(hi, lo, buffer, ScheduleState.start(batch, device), checkpoint, seq_ids, layer_idx, packed,
                            residual)

    cast = lambda t: t.to(compute_dtype)  # noqa: E731
    # the buffer keeps x and B in the buffer dtype, as vLLM's x_cache / B_cache keep them in the activation
    # dtype (vllm-project/vllm#48018, selective_state_update_replayssm_output_only.py); dt stays FP32
    rounded = config.round_buffered
    return Inputs(rounded(cast(x)), cast(dt), cast(A), rounded(cast(B)), cast(C), cast(D), cast(x), state, config,
                  x.dtype)


def _seq_ids(seq_ids, batch: int, device) -> torch.Tensor:
    if seq_ids is None:
        return torch.arange(batch, dtype=torch.int64, device=device)
    seq_ids = torch.as_tensor(seq_ids)
    if seq_ids.shape != (batch,) or seq_ids.dtype.is_floating_point or seq_ids.dtype == torch.bool:
        raise ValueError(f"seq_ids must be {batch} integers (one per sequence), got {seq_ids.dtype} of shape {list(seq_ids.shape)}")
    return seq_ids.to(device=device, dtype=torch.int64)


def _check_replay_state(state: ReplayState, config, layer_idx, seq_ids, dims, device, compute_dtype) -> ReplayState:
    batch, heads, head_dim, groups, d_state = dims
    for name in ("hi", "lo"):
        check_tensor(f"initial_state.{name}", getattr(state, name), (batch, heads, head_dim, d_state),
                     device=device, dtypes=(torch.float32,))
    if set(state.buffer) != set(BUFFER_KEYS):
        raise ValueError(f"initial_state.buffer has keys {sorted(state.buffer)}, expected {sorted(BUFFER_KEYS)} (a Mamba-2 state)")
    capacity = state.buffer["x"].shape[1] if state.buffer["x"].dim() == 4 else None
    check_tensor("initial_state.buffer['x']", state.buffer["x"], (batch, capacity, heads, head_dim), device=device)
    check_tensor("initial_state.buffer['B']", state.buffer["B"], (batch, capacity, groups, d_state), device=device)
    check_tensor("initial_state.buffer['dt']", state.buffer["dt"], (batch, capacity, heads), device=device)
    for name in ("count", "step_left", "steps"):
        check_tensor(f"initial_state.schedule.{name}", getattr(state.schedule, name), (batch,), device=device, dtypes=(torch.int64,))
    check_tensor("initial_state.schedule.step_read_hi", state.schedule.step_read_hi, (batch,), device=device, dtypes=(torch.bool,))
    check_tensor("initial_state.checkpoint", state.checkpoint, (batch,), device=device, dtypes=(torch.int64,))
    if state.layer != layer_idx:
        raise ValueError(f"layer_idx is {layer_idx} but initial_state belongs to layer {state.layer}; pass layer_idx={state.layer}")
    if seq_ids is not None and not same_values(_seq_ids(seq_ids, batch, device), state.seq_ids):
        raise ValueError(f"seq_ids {torch.as_tensor(seq_ids).tolist()} differ from initial_state.seq_ids {state.seq_ids.tolist()}")
    if state.lo_packed is not None and state.lo_packed.format != config.read:
        raise ValueError(f"initial_state's read copy is in '{state.lo_packed.format}', expected the config's read format '{config.read}'")
    check_residual(state, config, (batch, heads, head_dim, d_state), device)
    need = buffer_capacity(config)
    max_count = largest(state.schedule.count)
    if max_count > min(capacity, need):
        raise ValueError(f"initial_state holds {max_count} buffered entries, more than the buffer capacity {min(capacity, need)} of config {config.name}")
    buffer = {}
    for key, t in state.buffer.items():
        t = t.to(compute_dtype)
        if t.shape[1] < need:
            t = torch.cat([t, t.new_zeros(batch, need - t.shape[1], *t.shape[2:])], dim=1)
        buffer[key] = t[:, :need].clone()
    return replace(state, buffer=buffer, residual={copy: t.clone() for copy, t in state.residual.items()})

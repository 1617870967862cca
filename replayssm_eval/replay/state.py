"""`ReplayState`: one SSM layer's stored state for a batch of sequences, and how a checkpoint is written.

A checkpoint is written at prefill (checkpoint 0) and at every flush: the FP32 state S is cast
independently to the recurrence format (S_hi) and to the read format (S_lo); with a shared
checkpoint one cast serves both. Stochastic rounding draws its bits from `replay.keys`.
CUDA states are encoded by `formats.triton.encode_triton` (one launch per copy, same bits) where it
covers the format (`packed_codec`); CPU states and the other formats use the torch `fmt.encode`.
All tensors here use the formats' layout `[B, H, P, N]` (GDN passes its `[B, HV, K, V]` state
transposed to `[B, HV, V, K]`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from replayssm_eval.formats.codec import packed_codec
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.keys import READ_COPY, RECUR_COPY, sr_keys, state_random_bits
from replayssm_eval.replay.schedule import ScheduleState


@dataclass
class ReplayState:
    """Stored state of one layer.

    hi: [B, H, P, N] fp32, recurrence checkpoint S_hi (values on the recurrence format's grid).
    lo: [B, H, P, N] fp32, read copy S_lo decoded (the same tensor as `hi` when shared).
    buffer: ring entries since the newest checkpoint, family-specific names, each [B, capacity, ...];
        entries [0, schedule.count[b]) are valid for sequence b.
    schedule: window phase / speculative step position per sequence.
    checkpoint: [B] int64, index of the newest checkpoint (0 = the prefill write).
    seq_ids: [B] int64, sequence ids that key the random bits.
    layer: layer index that keys the random bits.
    lo_packed: the read copy in the read format's packed encoding, for backends that read it.
    """

    hi: torch.Tensor
    lo: torch.Tensor
    buffer: dict[str, torch.Tensor]
    schedule: ScheduleState
    checkpoint: torch.Tensor
    seq_ids: torch.Tensor
    layer: int
    lo_packed: object | None = field(default=None, repr=False)

    @property
    def batch(self) -> int:
        return self.hi.shape[0]


def write_checkpoint(
    state: torch.Tensor, config: ReplayConfig, layer: int, seq_ids: torch.Tensor, checkpoint: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round an FP32 state [B, H, P, N] to both stored copies; returns (S_hi, S_lo), fp32."""
    hi, lo, _ = write_checkpoint_packed(state, config, layer, seq_ids, checkpoint)
    return hi, lo


def write_checkpoint_packed(
    state: torch.Tensor, config: ReplayConfig, layer: int, seq_ids: torch.Tensor, checkpoint: torch.Tensor
):
    """`write_checkpoint` that also returns the read copy in its packed encoding (what a kernel reads).

    Returns (S_hi, S_lo, lo_packed); S_hi and S_lo are bit-identical to `write_checkpoint`'s and
    `read_format.decode(lo_packed)` equals S_lo (the recurrence copy's encoding when shared).
    """
    state = state.float()
    hi_packed = _encode(state, config.recur_format, config.seed, layer, seq_ids, checkpoint, RECUR_COPY)
    hi = config.recur_format.decode(hi_packed)
    if config.shared:
        return hi, hi, hi_packed
    lo_packed = _encode(state, config.read_format, config.seed, layer, seq_ids, checkpoint, READ_COPY)
    return hi, config.read_format.decode(lo_packed), lo_packed


def _use_triton(state: torch.Tensor, fmt) -> bool:
    """Encode with the one-launch Triton encoder: CUDA states in the formats it covers (CPU keeps torch)."""
    return state.is_cuda and packed_codec(fmt) is not None


def _encode(state, fmt, seed, layer, seq_ids, checkpoint, copy):
    """`fmt.encode` of one stored copy of states [B, H, P, N], SR bits keyed by (seed, layer, sequence, copy)."""
    keys = sr_keys(seed, layer, seq_ids, copy) if fmt.is_stochastic else None
    return encode_keyed(state, fmt, keys, checkpoint)


def encode_keyed(state, fmt, keys, checkpoint):
    """`_encode` with the copy's Philox keys given ([B] int64 `sr_keys`, None for deterministic formats)."""
    if _use_triton(state, fmt):
        from replayssm_eval.formats.triton import encode_triton

        return encode_triton(state, fmt, keys, checkpoint)  # moves keys and checkpoint to the state's device
    if not fmt.is_stochastic:
        return fmt.encode(state)
    return fmt.encode(state, random_bits=state_random_bits(keys, checkpoint, tuple(state.shape[1:])))


def round_folded(copy: torch.Tensor, fmt, keys: torch.Tensor, checkpoint: torch.Tensor, fold: torch.Tensor,
                 fold_host: list[bool]) -> None:
    """Round in place the FP32 folds a kernel stored unrounded in `copy` [B, H, P, N] (format layout), as
    `write_checkpoint` does: `fmt`'s encoding, the copy's Philox keys [B] and the new checkpoint indices [B].
    Only sequences with fold[b] (fold_host: its host copy, which steers without a device sync) take the rounding."""
    if not any(fold_host):
        return
    new = fmt.decode(encode_keyed(copy, fmt, keys, checkpoint))  # [B, H, P, N]: every sequence, one launch or pass
    copy.copy_(new if all(fold_host) else torch.where(fold[:, None, None, None], new, copy))

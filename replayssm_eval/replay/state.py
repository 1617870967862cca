"""`ReplayState`: one SSM layer's stored state for a batch of sequences, and how a checkpoint is written.

A checkpoint is written at prefill (checkpoint 0) and at every flush: the FP32 state S is cast
independently to the recurrence format (S_hi) and to the read format (S_lo); with a shared
checkpoint one cast serves both. Stochastic rounding draws its bits from `replay.keys`.
CUDA states are encoded by `formats.triton.encode_triton` (one launch per copy, same bits) in every format
with a kernel codec; CPU states use the torch `fmt.encode`.
A copy in a format with error feedback (`ef=`, `formats.feedback`) keeps the residual of its last
rounding in `ReplayState.residual` and adds it to S before its next rounding, at every checkpoint write
of every kernel (the chunked Triton kernels where they round the copy, else the call runs on torch).
All tensors here use the formats' layout `[B, H, P, N]` (GDN passes its `[B, HV, K, V]` state
transposed to `[B, HV, V, K]`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

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
    residual: {copy: [B, H, P, N] fp32} error-feedback residual of each stored copy whose format has one
        (`RECUR_COPY`, `READ_COPY`; a shared checkpoint has one copy, `RECUR_COPY`); empty without.
    """

    hi: torch.Tensor
    lo: torch.Tensor
    buffer: dict[str, torch.Tensor]
    schedule: ScheduleState
    checkpoint: torch.Tensor
    seq_ids: torch.Tensor
    layer: int
    lo_packed: object | None = field(default=None, repr=False)
    residual: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def batch(self) -> int:
        return self.hi.shape[0]


def feedback_copies(config: ReplayConfig) -> dict[int, object]:
    """{copy: format} of the stored copies whose format keeps an error-feedback residual (a shared checkpoint: one)."""
    copies = {RECUR_COPY: config.recur_format} if config.shared else {
        RECUR_COPY: config.recur_format, READ_COPY: config.read_format}
    return {copy: fmt for copy, fmt in copies.items() if fmt.feedback}


def carries_feedback(codecs, config: ReplayConfig) -> bool:
    """Whether a kernel with these in-loop codecs (S_hi's, S_lo's: a `KernelCodec`, None for a copy torch rounds)
    carries every residual of `config` (`feedback_copies`): each copy that keeps one rounds in the loop."""
    return all(codecs[copy] is not None for copy in feedback_copies(config))


def chunked_backend(config: ReplayConfig, backend: str, family: str, carried: bool = False) -> str:
    """The chunked backend that runs `config`: "torch", with a warning, where "triton" was asked for a config with
    error feedback whose residuals the family's Triton kernels do not carry (`carried`: they do), else `backend`."""
    if backend == "triton" and feedback_copies(config) and not carried:
        warnings.warn(f"{family} chunked backend='triton' runs the torch backend: the Triton kernels do not carry "
                      f"the error-feedback residuals (ef=) of {config.name!r}", stacklevel=3)
        return "torch"
    return backend


def zero_residual(config: ReplayConfig, shape: tuple[int, ...], device) -> dict[int, torch.Tensor]:
    """The residuals before a copy's first rounding: zeros [B, H, P, N] for each copy with feedback."""
    return {copy: torch.zeros(shape, device=device) for copy in feedback_copies(config)}


def check_residual(state: ReplayState, config: ReplayConfig, shape: tuple[int, ...], device) -> None:
    """A carried state's residuals are those of the config's copies with feedback, each [B, H, P, N] fp32."""
    want = feedback_copies(config)
    if set(state.residual) != set(want):
        raise ValueError(f"initial_state carries error-feedback residuals of copies {sorted(state.residual)}, config "
                         f"{config.name!r} keeps them for copies {sorted(want)}; accepted: a state of this config")
    for copy, t in state.residual.items():
        if tuple(t.shape) != tuple(shape) or t.dtype != torch.float32 or t.device.type != torch.device(device).type:
            raise ValueError(f"initial_state.residual[{copy}] is {t.dtype} {list(t.shape)} on {t.device}; "
                             f"expected torch.float32 {list(shape)} on {device}")


def write_checkpoint(
    state: torch.Tensor, config: ReplayConfig, layer: int, seq_ids: torch.Tensor, checkpoint: torch.Tensor,
    residual: dict[int, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round an FP32 state [B, H, P, N] to both stored copies; returns (S_hi, S_lo), fp32.

    residual: these rows' error-feedback residuals ({copy: [B, H, P, N]}, `ReplayState.residual`), needed when
    the config has any (`feedback_copies`); each is added to the state before its copy's rounding and replaced
    in the dict by the residual of that rounding.
    """
    hi, lo, _ = write_checkpoint_packed(state, config, layer, seq_ids, checkpoint, residual)
    return hi, lo


def write_checkpoint_packed(
    state: torch.Tensor, config: ReplayConfig, layer: int, seq_ids: torch.Tensor, checkpoint: torch.Tensor,
    residual: dict[int, torch.Tensor] | None = None,
):
    """`write_checkpoint` that also returns the read copy in its packed encoding (what a kernel reads).

    Returns (S_hi, S_lo, lo_packed); S_hi and S_lo are bit-identical to `write_checkpoint`'s and
    `read_format.decode(lo_packed)` equals S_lo (the recurrence copy's encoding when shared).
    """
    if residual is None and feedback_copies(config):
        raise ValueError(f"config {config.name!r} keeps error-feedback residuals (ef=) and this path does not "
                         "carry them; accepted: the torch kernels (backend='torch', the chunked or reference engine)")
    state = state.float()
    hi, hi_packed = _encode(state, config.recur_format, config.seed, layer, seq_ids, checkpoint, RECUR_COPY, residual)
    if config.shared:
        return hi, hi, hi_packed
    lo, lo_packed = _encode(state, config.read_format, config.seed, layer, seq_ids, checkpoint, READ_COPY, residual)
    return hi, lo, lo_packed


def write_read_copy_packed(
    state: torch.Tensor, config: ReplayConfig, layer: int, seq_ids: torch.Tensor, checkpoint: torch.Tensor,
    residual: dict[int, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, object]:
    """`write_checkpoint_packed`'s (S_lo, lo_packed) alone, the same bits, for a kernel that rounded S_hi itself (a
    shared checkpoint's S_lo is S_hi, so then its copy). residual: where that copy keeps an error-feedback residual,
    {copy: its residual before this rounding [B, H, P, N]}, replaced by the rounding's (as `write_checkpoint`)."""
    fmt, copy = (config.recur_format, RECUR_COPY) if config.shared else (config.read_format, READ_COPY)
    if fmt.feedback and residual is None:
        raise ValueError(f"the read copy of {config.name!r} keeps an error-feedback residual (ef=) and "
                         "write_read_copy_packed was given none; accepted: residual={copy: its residual}")
    return _encode(state.float(), fmt, config.seed, layer, seq_ids, checkpoint, copy, residual)


def _use_triton(state: torch.Tensor, fmt) -> bool:
    """Encode with the one-launch Triton encoder: CUDA states in the formats with a kernel codec (CPU keeps torch)."""
    return state.is_cuda and fmt.kernel_codec is not None


def _encode(state, fmt, seed, layer, seq_ids, checkpoint, copy, residual):
    """(`fmt.decode` of it, `fmt.encode`) of one stored copy of states [B, H, P, N], SR bits keyed by (seed, layer,
    sequence, copy); with error feedback, of the state plus the copy's residual, whose entry in `residual` becomes the
    new one. On CUDA the encoder's launch also writes the decoded copy."""
    keys = sr_keys(seed, layer, seq_ids, copy) if fmt.is_stochastic else None
    target = state + residual[copy] if fmt.feedback else state
    decoded = torch.empty(target.shape, device=target.device) if _use_triton(target, fmt) else None
    packed = _encode_keyed(target, fmt, keys, checkpoint, decoded)
    decoded = fmt.decode(packed) if decoded is None else decoded
    if fmt.feedback:
        residual[copy] = fmt.residual(target, decoded)
    return decoded, packed


def encode_keyed(state, fmt, keys, checkpoint):
    """`_encode` with the copy's Philox keys given ([B] int64 `sr_keys`, None for deterministic formats); a format
    with error feedback is refused (the residual is `write_checkpoint`'s, or see `encode_target`)."""
    if fmt.feedback:
        raise ValueError(f"state format '{fmt.name}' keeps an error-feedback residual that this path does not carry; "
                         "accepted: the torch kernels (backend='torch', the chunked or reference engine)")
    return _encode_keyed(state, fmt, keys, checkpoint)


def encode_target(target, fmt, keys, checkpoint):
    """`encode_keyed` of a rounding target, which for a format with error feedback holds the copy's residual already
    (state + e, as `write_checkpoint` forms it): the caller keeps the new one, `fmt.residual(target, decoded)`."""
    return _encode_keyed(target, fmt, keys, checkpoint)


def _encode_keyed(state, fmt, keys, checkpoint, decoded=None):
    """decoded: an FP32 tensor of the state's shape that the Triton encoder fills with `fmt.decode` of the result in
    the same launch (CUDA states only)."""
    if _use_triton(state, fmt):
        from replayssm_eval.formats.triton import encode_triton

        return encode_triton(state, fmt, keys, checkpoint, decoded=decoded)  # moves keys and checkpoint to its device
    if not fmt.is_stochastic:
        return fmt.encode(state)
    return fmt.encode(state, random_bits=state_random_bits(keys, checkpoint, tuple(state.shape[1:]), fmt.lane_words))


def round_folded(copy: torch.Tensor, fmt, keys: torch.Tensor, checkpoint: torch.Tensor, fold: torch.Tensor,
                 fold_host: list[bool]) -> None:
    """Round in place the FP32 folds a kernel stored unrounded in `copy` [B, H, P, N] (format layout), as
    `write_checkpoint` does: `fmt`'s encoding, the copy's Philox keys [B] and the new checkpoint indices [B].
    Only sequences with fold[b] (fold_host: its host copy, which steers without a device sync) take the rounding."""
    if not any(fold_host):
        return
    new = fmt.decode(encode_keyed(copy, fmt, keys, checkpoint))  # [B, H, P, N]: every sequence, one launch or pass
    copy.copy_(new if all(fold_host) else torch.where(fold[:, None, None, None], new, copy))

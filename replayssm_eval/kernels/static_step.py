"""Static one-token decode step: every stored tensor preallocated and updated in place, no host sync.

`StaticState` holds one SSM layer's ReplayState in fixed buffers: the recurrence copy S_hi, the
read copy S_lo and its packed encoding, the ring buffer, and per row the window phase (`count`),
the checkpoint index and the Philox keys of both copies (computed on the device from the
sequence ids, `replay.device_keys`). `step(...)` decodes one token for every row with the
family's fixed-buffer step (`KernelFamily.fixed_step`: its single-token Triton kernel) and
leaves the state where the family's `decode_step` would leave it, bit for bit (docs/semantics.md,
decode semantics).

Flush or not is decided per row on the device: row b folds after this token when
count[b] = L - 1. The kernel writes the FP32 fold of the folding rows only; the rounding then
writes the new checkpoint of those rows in place: one `encode_triton` launch per stored copy
(`take=` the folding rows, `out=` the packed read copy, `decoded=` S_hi or S_lo), or, for formats
it does not cover, torch's encode of every row and `torch.where` selects. A step has three variants
(`FOLDS`, `kernels.step_variants`): no row folds ("none": no rounding), some rows fold ("some"), every row
folds ("all": no selection; every step of an L = 1 config, every flush of rows that started together). A
"some" step runs the family's single-token kernel twice: its reading path for the rows that do not fold
(what a "none" step runs) and its folding path for those that do (what an "all" step runs), each launch's
programs of the other's rows returning at once (`step_variants.step_launches`); so every row gets the bits
it gets in a "none" or an "all" step, whatever the other rows do. The encode, its head amax and the ring
reset read and write the folding rows only too (the encode's programs, a fixed number per row block, take
the folding rows in turn; the others' programs return at once in the other rows), so a step where a few
rows fold does not cost a flush of every row: the engine's case, whose rows joined at different times and
fold at different steps. The caller
knows the variant without reading the device, since every row's phase advances by one per token
(`StaticState.host_count`). With an FP32 recurrence copy the kernel writes the fold into S_hi itself (a
folding row's tile is read before it is written, by the same program), and a shared FP32 read copy is S_hi
itself, so an L = 1 FP32 step moves the state once, as a conventional step does.

The tensors of a step never change address, so the step can be captured as a CUDA graph
(`models.layer_graph`) and replayed; on CPU and in the Triton interpreter the same code runs eagerly.
Fixed windows only: speculative schedules (host-side acceptance draws) and FP64 are refused, and so are
round trips inside the decode (`#rt=...@every:N`, `@at:P`: they replace a state the buffers hold in place);
a round trip at the prompt's end is applied before the state enters the buffers (`models.static_session`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm_eval.formats import PackedState
from replayssm_eval.formats.codec import Group, packed_codec
from replayssm_eval.formats.triton import encode_triton
from replayssm_eval.kernels.family import get_family
from replayssm_eval.kernels.step_variants import FOLDS
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.device_keys import sr_keys_device
from replayssm_eval.replay.keys import READ_COPY, RECUR_COPY
from replayssm_eval.replay.schedule import ScheduleState
from replayssm_eval.replay.state import ReplayState, encode_keyed


def folds_of(counts: list[int], window: int) -> str:
    """The step variant of rows at window phases `counts` (host ints): "none", "some" or "all" fold after it."""
    folding = sum(c == window - 1 for c in counts)
    return "none" if folding == 0 else "all" if folding == len(counts) else "some"


def check_static_family(family: str) -> None:
    """Raise a one-line error for SSM families without a fixed-buffer step (`KernelFamily.fixed_step`)."""
    if get_family(family).fixed_step is None:
        raise ValueError(f"the {family} family has no fixed-buffer decode step (KernelFamily.fixed_step); "
                         "use step='triton'")


def check_static_config(config: ReplayConfig) -> None:
    """Raise a one-line error for configs the static step does not cover (speculative schedules, mixed configs,
    round trips inside the decode)."""
    if config.overrides:
        raise ValueError(f"the static decode step takes one config for every layer, got mixed config {config.name!r}; "
                         "use step='triton'")
    if config.speculative is not None:
        raise ValueError(f"the static decode step covers fixed windows only, got speculative config {config.name!r}; "
                         "use step='triton'")
    if config.round_trip is not None and not config.round_trip.prompt:
        raise ValueError(f"the static decode step restores round trips at the prompt's end only, got "
                         f"#rt={config.round_trip.name} in config {config.name!r}; accepted: #rt=FORMAT@prompt, "
                         "or step='triton'")


@dataclass
class StaticState:
    """One layer's stored state in fixed buffers (format layout [B, H, P, N]; GDN and KDA [B, HV, V, K]).

    hi, lo: S_hi and S_lo, fp32 (the same tensor when shared); packed: the read copy's encoding
    (the recurrence copy's when shared; its data is hi when that is FP32);
    buffer: the family's ring entries [B, L, ...];
    count, checkpoint, seq_ids: [B] int64; keys: [2, B] int64 Philox keys (recurrence, read copy);
    fold_out: [B, H, P, N] fp32, the FP32 fold the kernel writes for folding rows (hi itself with an
    FP32 recurrence copy);
    host_count: count as host ints, advanced arithmetically (never read from the device).
    """

    family: str
    config: ReplayConfig
    layer: int
    hi: torch.Tensor
    lo: torch.Tensor
    packed: PackedState
    buffer: dict[str, torch.Tensor]
    count: torch.Tensor
    checkpoint: torch.Tensor
    seq_ids: torch.Tensor
    keys: torch.Tensor
    fold_out: torch.Tensor
    host_count: list[int]

    @classmethod
    def from_replay_state(cls, family: str, state: ReplayState, packed: PackedState, config: ReplayConfig,
                          host_count: list[int], fold_out: torch.Tensor | None = None) -> "StaticState":
        """Own copies of `state` (and its packed read copy) in fresh buffers; host_count: its schedule's count.
        fold_out: a scratch of hi's shape to use (layers of one shape may share one), else a new one; unused with
        an FP32 recurrence copy (`folds_in_place`)."""
        check_static_family(family)
        check_static_config(config)
        hi = state.hi.float().contiguous().clone()
        in_place = folds_in_place(config)
        if fold_out is not None and (fold_out.shape != hi.shape or not fold_out.is_contiguous()):
            raise ValueError(f"fold_out must be a contiguous tensor of shape {list(hi.shape)}, got {list(fold_out.shape)} "
                             f"(contiguous={fold_out.is_contiguous()})")
        lo = hi if config.shared else state.lo.float().contiguous().clone()
        own = lambda t: None if t is None else t.contiguous().clone()  # noqa: E731
        data = hi if config.shared and in_place else own(packed.data)  # FP32 encodes as itself
        packed = PackedState(packed.format, packed.shape, data, own(packed.scales), own(packed.global_scale))
        seq_ids = state.seq_ids.to(device=hi.device, dtype=torch.int64).clone()
        keys = torch.stack([sr_keys_device(config.seed, state.layer, seq_ids, RECUR_COPY),
                            sr_keys_device(config.seed, state.layer, seq_ids, READ_COPY)])
        return cls(family, config, state.layer, hi, lo, packed, {k: v.contiguous().clone() for k, v in state.buffer.items()},
                   state.schedule.count.clone(), state.checkpoint.clone(), seq_ids, keys,
                   hi if in_place else torch.zeros_like(hi) if fold_out is None else fold_out,
                   list(host_count))

    @property
    def folds_next(self) -> str:
        """The next step's variant, "none", "some" or "all" rows fold after it (from host_count: no device read)."""
        return folds_of(self.host_count, self.config.window)

    def replay_state(self) -> ReplayState:
        """A ReplayState over these buffers (views, not copies: it follows every later step)."""
        zeros = torch.zeros_like(self.count)
        schedule = ScheduleState(self.count, zeros, torch.zeros_like(self.count, dtype=torch.bool), zeros)
        return ReplayState(self.hi, self.lo, self.buffer, schedule, self.checkpoint, self.seq_ids, self.layer, self.packed)

    def step(self, inputs: tuple, folds: str) -> torch.Tensor:
        """`step_device`, then advance host_count: one decode token of every row."""
        y = self.step_device(inputs, folds)
        self.advance_host()
        return y

    def advance_host(self) -> None:
        self.host_count = [(c + 1) % self.config.window for c in self.host_count]

    def step_device(self, inputs: tuple, folds: str) -> torch.Tensor:
        """Decode one token of every row in place, device work only (what a CUDA graph captures). inputs: the
        family's tensors for one token, fp32, in the order and shapes of `KernelFamily.inputs` with T = 1 (e.g. Mamba-2
        x [B, 1, H, P], dt [B, 1, H], A [H], B, C [B, 1, G, N], D [H]). folds: the variant, `folds_next` (must cover
        the rows that fold). Returns the family's output for the token, [B, 1, ...] fp32 (`KernelFamily.fixed_step`)."""
        if folds not in FOLDS:
            raise ValueError(f"unknown step variant {folds!r}; known: {', '.join(FOLDS)}")
        fold = self.count == self.config.window - 1  # [B] bool
        y = get_family(self.family).fixed_step(self, inputs, fold, folds)
        if folds != "none":
            self._round_folds(fold, None if folds == "all" else fold)
        self.count.copy_((self.count + 1) % self.config.window)
        return y

    def _round_folds(self, fold: torch.Tensor, rows: torch.Tensor | None) -> None:
        """Write the next checkpoint of the folding rows from fold_out (as `write_checkpoint_packed`); others keep theirs.
        rows: fold [B] bool, or None when every row folds."""
        cfg = self.config
        checkpoint = self.checkpoint + fold.to(torch.int64)  # [B]
        if self.fold_out is not self.hi:  # an FP32 recurrence copy holds its folds already
            self._round(cfg.recur_format, RECUR_COPY, checkpoint, rows, self.hi, self.packed if cfg.shared else None)
        if not cfg.shared:
            self._round(cfg.read_format, READ_COPY, checkpoint, rows, self.lo, self.packed)
        self.checkpoint.copy_(checkpoint)

    def _round(self, fmt, copy: int, checkpoint: torch.Tensor, rows: torch.Tensor | None, decoded: torch.Tensor,
               packed: PackedState | None) -> None:
        """Encode fold_out's rows `rows` (None: all) in `fmt` with copy `copy`'s Philox keys into `packed`'s fields
        (None: the encoding is not kept) and its decoding into `decoded`, in place: one Triton launch where
        `encode_triton` covers the format (`packed_codec`), else torch's encode, decode and selects."""
        keys = self.keys[copy] if fmt.is_stochastic else None
        codec = packed_codec(fmt)
        if codec is not None and (rows is None or codec.group != Group.TENSOR):
            encode_triton(self.fold_out, fmt, keys, checkpoint, take=rows, out=packed, decoded=decoded)
            return
        new = encode_keyed(self.fold_out, fmt, keys, checkpoint)
        _put(decoded, fmt.decode(new), rows)
        for name in ("data", "scales", "global_scale") if packed is not None else ():
            old = getattr(packed, name)
            if old is not None:
                _put(old, getattr(new, name), rows)


def folds_in_place(config: ReplayConfig) -> bool:
    """Whether the step kernel writes the folds into S_hi itself: an FP32 recurrence copy (no rounding)."""
    return config.recur_format.name == "fp32"


def _put(old: torch.Tensor, new: torch.Tensor, rows: torch.Tensor | None) -> None:
    """old[b] = new[b] where rows[b] (every row when rows is None), in place; every field leads with the batch dim."""
    new = new.reshape(old.shape) if new.dim() else new
    if rows is None:
        old.copy_(new)
    else:
        torch.where(rows.view(-1, *[1] * (old.dim() - 1)), new.to(old.dtype), old, out=old)

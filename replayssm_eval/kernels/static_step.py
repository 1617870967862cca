"""Static one-token decode step: every stored tensor preallocated and updated in place, no host sync.

`StaticState` holds one SSM layer's ReplayState in fixed buffers: the recurrence copy S_hi, the
read copy S_lo and its packed encoding, the copies' error-feedback residuals (`ef=`), the ring
buffer, and per row the window phase (`count`), the checkpoint index and the Philox keys of both
copies (computed on the device from the sequence ids, `replay.device_keys`). `step(...)` decodes
one token for every row with the family's fixed-buffer step (`KernelFamily.fixed_step`: its
single-token Triton kernel) and leaves the state where the family's `decode_step` would leave it,
bit for bit (docs/semantics.md, decode semantics).

Flush or not is decided per row on the device: row b folds after this token when
count[b] = L - 1. The kernel writes the FP32 fold of the folding rows only; the rounding then
writes the new checkpoint of those rows in place: one `encode_triton` launch per stored copy
(`take=` the folding rows, `out=` the packed read copy, `decoded=` S_hi or S_lo), or, for a format without a kernel
codec, torch's encode of every row and `torch.where` selects. A step has three variants
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

Round trips inside the decode (`#rt=FORMAT@every:N`, `@at:P`, docs/semantics.md, "State round trips") are
decided per row on the device too: `Trips` keeps each row's position (its real tokens consumed, prompt included, as
`ReplaySession` counts them) and whether its round trip is due before the next step; a step with `trips=True` first
restores the due rows in place (`_round_trip`: the live state stored and restored, a checkpoint written from it as a
fold writes one, the ring emptied) and every step advances the positions and recomputes `due`. Rows that joined at
different times keep their own positions, so each takes its round trips at its own tokens. Whether any row is due is
known on the host (`Trips.host_position`, advanced as `host_count` is), so a step where none is due only advances the
positions; a step where one is (`trips=True`, a second variant of each `FOLDS` variant) computes the live state of
every row and keeps the due rows': exact, and no host read. A round trip is taken at the start of the step that
consumes the token after its position, as `ReplaySession` cuts its calls there, so between steps the buffers hold
what the eager step carries. Round trips due when the state enters the buffers from the FP32 anchor, and one at the
prompt's end, are taken before (`models.static_session`), from the anchor itself as `ReplaySession` takes them.

The tensors of a step never change address, so the step can be captured as a CUDA graph
(`models.layer_graph`) and replayed; on CPU and in the Triton interpreter the same code runs eagerly.
Fixed windows and one config for every layer only: speculative schedules (host-side acceptance draws), mixed
configs and FP64 are refused (`check_static_config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from replayssm_eval.formats import PackedState
from replayssm_eval.formats.triton import encode_triton
from replayssm_eval.kernels.family import get_family
from replayssm_eval.kernels.round_trip import stored_and_restored
from replayssm_eval.kernels.step_variants import FOLDS
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.device_keys import sr_keys_device
from replayssm_eval.replay.keys import READ_COPY, RECUR_COPY, ROUND_TRIP_COPY
from replayssm_eval.replay.schedule import ScheduleState
from replayssm_eval.replay.state import ReplayState, encode_target


def folds_of(counts: list[int], window: int) -> str:
    """The step variant of rows at window phases `counts` (host ints): "none", "some" or "all" fold after it."""
    folding = sum(c == window - 1 for c in counts)
    return "none" if folding == 0 else "all" if folding == len(counts) else "some"


def check_static_family(family: str) -> None:
    """Raise a one-line error for SSM families without a fixed-buffer step (`KernelFamily.fixed_step`)."""
    if get_family(family).fixed_step is None:
        raise ValueError(f"the {family} family has no fixed-buffer decode step (KernelFamily.fixed_step); "
                         "use step='triton'")


def check_static_config(config: ReplayConfig, step: str = "the static decode step",
                        instead: str = "step='triton'") -> None:
    """Raise a one-line error for configs the fixed-buffer steps do not cover: mixed configs and speculative schedules.
    step: the caller's name of its step (e.g. "step 'graph'", "--step static"); instead: what the error says to use."""
    if config.overrides:
        raise ValueError(f"{step} takes one config for every layer, got mixed config {config.name!r}; use {instead}")
    if config.speculative is not None:
        raise ValueError(f"{step} covers fixed windows only, got speculative config {config.name!r}; use {instead}")


@dataclass
class Trips:
    """Per row, the round trips inside the decode (`#rt=FORMAT@every:N`, `@at:P`) of a `StaticState`.

    position: [B] int64, the real tokens each row consumed before the next step, prompt included (as `ReplaySession`
    counts them); due: [B] bool, the rows whose round trip comes before the next step; keys: [B] int64, the Philox
    keys of `ROUND_TRIP_COPY` (None for a deterministic format); points: [K] int64, the listed positions `at`;
    host_position, host_due: position and due as host values, advanced arithmetically (never read from the device).
    """

    position: torch.Tensor
    due: torch.Tensor
    keys: torch.Tensor | None
    points: torch.Tensor
    host_position: list[int]
    host_due: list[bool]


@dataclass
class StaticState:
    """One layer's stored state in fixed buffers (format layout [B, H, P, N]; GDN and KDA [B, HV, V, K]).

    hi, lo: S_hi and S_lo, fp32 (the same tensor when shared); packed: the read copy's encoding
    (the recurrence copy's when shared; its data is hi when that is FP32);
    buffer: the family's ring entries [B, L, ...];
    count, checkpoint, seq_ids: [B] int64; keys: [2, B] int64 Philox keys (recurrence, read copy);
    fold_out: [B, H, P, N] fp32, the FP32 fold the kernel writes for folding rows (hi itself with an
    FP32 recurrence copy);
    host_count: count as host ints, advanced arithmetically (never read from the device);
    trips: the round trips inside the decode (None: the config has none, or they are taken elsewhere);
    residual: the error-feedback residuals {copy: [B, H, P, N] fp32} of the copies that keep one (`ef=`).
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
    trips: Trips | None = None
    residual: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def from_replay_state(cls, family: str, state: ReplayState, packed: PackedState, config: ReplayConfig,
                          host_count: list[int], fold_out: torch.Tensor | None = None,
                          positions: list[int] | None = None, taken: bool = False) -> "StaticState":
        """Own copies of `state` (and its packed read copy) in fresh buffers; host_count: its schedule's count.
        fold_out: a scratch of hi's shape to use (layers of one shape may share one), else a new one; unused with
        an FP32 recurrence copy (`folds_in_place`). positions: each row's real tokens consumed so far, prompt
        included, for a config with round trips inside the decode (None: the state takes none, as a plain FP32
        session, whose round trips through fp32 change nothing); taken: the round trips at `positions` are taken
        already (`models.static_session` takes those of the FP32 anchor itself)."""
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
        packed = PackedState(packed.format, packed.shape, data, *(own(t) for t in packed.tensors()[1:]))
        seq_ids = state.seq_ids.to(device=hi.device, dtype=torch.int64).clone()
        keys = _copy_keys(config, state.layer, seq_ids)
        trips = None
        if positions is not None and config.round_trip is not None and not config.round_trip.prompt:
            trip = config.round_trip
            position = torch.tensor(positions, dtype=torch.int64, device=hi.device)  # [B]
            due = torch.zeros_like(position, dtype=torch.bool) if taken else trip.hits(position)  # [B]
            trips = Trips(position, due, sr_keys_device(config.seed, state.layer, seq_ids, ROUND_TRIP_COPY)
                          if trip.format.is_stochastic else None, trip.points(hi.device), list(positions), due.tolist())
        return cls(family, config, state.layer, hi, lo, packed, {k: v.contiguous().clone() for k, v in state.buffer.items()},
                   state.schedule.count.clone(), state.checkpoint.clone(), seq_ids, keys,
                   hi if in_place else torch.zeros_like(hi) if fold_out is None else fold_out,
                   list(host_count), trips, {copy: own(t) for copy, t in state.residual.items()})

    def put_rows(self, slots: list[int], state: ReplayState, host_count: list[int],
                 positions: list[int] | None = None) -> None:
        """Rows `slots` take over the n sequences of `state` (this layer's ReplayState with its packed read copy,
        e.g. a session's after its first decode step), in place: both stored copies, their error-feedback residuals,
        the packed copy, the ring, the window phase (host_count: state's count as host ints), the checkpoint index,
        the seq_ids and their Philox keys; with round trips inside the decode, each row's position (a round trip due
        there comes first at the next step, as `from_replay_state` has it for a continued state). The buffers keep
        their addresses, so a CUDA graph that steps them stays valid."""
        rows = torch.tensor(slots, dtype=torch.int64, device=self.hi.device)
        put = lambda old, new: old.index_copy_(0, rows, new.to(old.dtype))  # noqa: E731
        put(self.hi, state.hi)
        if self.lo is not self.hi:
            put(self.lo, state.lo)
        for copy, t in self.residual.items():
            put(t, state.residual[copy])
        for name in PackedState.FIELDS:
            old = getattr(self.packed, name)
            if old is not None and old is not self.hi:  # an FP32 shared copy encodes as S_hi itself
                put(old, getattr(state.lo_packed, name))
        for name, t in self.buffer.items():
            put(t, state.buffer[name])
        put(self.count, state.schedule.count)
        put(self.checkpoint, state.checkpoint)
        seq_ids = state.seq_ids.to(device=self.hi.device, dtype=torch.int64)
        put(self.seq_ids, seq_ids)
        self.keys[:, rows] = _copy_keys(self.config, self.layer, seq_ids)
        for slot, count in zip(slots, host_count):
            self.host_count[slot] = count
        if self.trips is not None:
            trip = self.config.round_trip
            position = torch.tensor(positions, dtype=torch.int64, device=self.hi.device)  # [n]
            due = trip.hits(position)  # [n]
            put(self.trips.position, position)
            put(self.trips.due, due)
            if self.trips.keys is not None:
                put(self.trips.keys, sr_keys_device(self.config.seed, self.layer, seq_ids, ROUND_TRIP_COPY))
            for slot, pos, hit in zip(slots, positions, due.tolist()):
                self.trips.host_position[slot], self.trips.host_due[slot] = pos, hit

    @property
    def folds_next(self) -> str:
        """The next step's variant, "none", "some" or "all" rows fold after it (from host_count: no device read)."""
        return folds_of(self._phases(), self.config.window)

    def _phases(self) -> list[int]:
        """Each row's window phase as the next token finds it: 0 where its round trip is due first."""
        if self.trips is None:
            return self.host_count
        return [0 if due else c for c, due in zip(self.host_count, self.trips.host_due)]

    @property
    def trips_next(self) -> bool:
        """Whether some row's round trip comes before the next step (from host values: no device read)."""
        return self.trips is not None and any(self.trips.host_due)

    def replay_state(self) -> ReplayState:
        """A ReplayState over these buffers (views, not copies: it follows every later step)."""
        zeros = torch.zeros_like(self.count)
        schedule = ScheduleState(self.count, zeros, torch.zeros_like(self.count, dtype=torch.bool), zeros)
        return ReplayState(self.hi, self.lo, self.buffer, schedule, self.checkpoint, self.seq_ids, self.layer,
                           self.packed, self.residual)

    def step(self, inputs: tuple, folds: str, trips: bool = False) -> torch.Tensor:
        """`step_device`, then advance the host values: one decode token of every row."""
        y = self.step_device(inputs, folds, trips)
        self.advance_host()
        return y

    def advance_host(self) -> None:
        """The host values after a step (a row whose round trip was due restarted its window phase before the token)."""
        self.host_count = [(c + 1) % self.config.window for c in self._phases()]
        if self.trips is not None:
            self.trips.host_position = [p + 1 for p in self.trips.host_position]
            self.trips.host_due = self.config.round_trip.hits(torch.tensor(self.trips.host_position)).tolist()

    def step_device(self, inputs: tuple, folds: str, trips: bool = False) -> torch.Tensor:
        """Decode one token of every row in place, device work only (what a CUDA graph captures). inputs: the
        family's tensors for one token, fp32, in the order and shapes of `KernelFamily.inputs` with T = 1 (e.g. Mamba-2
        x [B, 1, H, P], dt [B, 1, H], A [H], B, C [B, 1, G, N], D [H]). folds: the variant, `folds_next` (must cover
        the rows that fold); trips: `trips_next`, the due rows' round trips first (`_round_trip`; must be True when
        some row is due). Returns the family's output for the token, [B, 1, ...] fp32 (`KernelFamily.fixed_step`)."""
        if folds not in FOLDS:
            raise ValueError(f"unknown step variant {folds!r}; known: {', '.join(FOLDS)}")
        if trips and self.trips is None:
            raise ValueError(f"this state takes no round trips inside the decode (config {self.config.name!r}); "
                             "accepted: trips=False")
        if trips:
            self._round_trip(inputs)
        fold = self.count == self.config.window - 1  # [B] bool
        y = get_family(self.family).fixed_step(self, inputs, fold, folds)
        if folds != "none":
            self._round_folds(fold, None if folds == "all" else fold)
        self.count.copy_((self.count + 1) % self.config.window)
        if self.trips is not None:
            self.trips.position.add_(1)
            self.trips.due.copy_(self.config.round_trip.hits(self.trips.position, self.trips.points))
        return y

    def _round_trip(self, inputs: tuple) -> None:
        """The due rows' round trip in place, as `kernels.round_trip.round_trip` takes it from a carried state: the
        live state (S_hi with the ring folded in, `KernelFamily.live_state`) stored in the round trip's format and
        restored, a checkpoint written from it at the current index (fold_out holds it, as a fold), the ring emptied
        and the window phase restarted; the other rows keep theirs."""
        due = self.trips.due  # [B] bool
        live = get_family(self.family).live_state(inputs, self.replay_state(), self.config)  # [B, H, P, N]
        restored = stored_and_restored(live, self.config.round_trip.format, self.trips.keys, self.checkpoint)
        _put(self.fold_out, restored, due)  # with an FP32 recurrence copy, fold_out is S_hi: its checkpoint written
        self._write(self.checkpoint, due)
        for t in self.buffer.values():
            t.masked_fill_(due.view(-1, *[1] * (t.dim() - 1)), 0)
        self.count.masked_fill_(due, 0)

    def _round_folds(self, fold: torch.Tensor, rows: torch.Tensor | None) -> None:
        """Write the next checkpoint of the folding rows from fold_out (as `write_checkpoint_packed`); others keep theirs.
        rows: fold [B] bool, or None when every row folds."""
        checkpoint = self.checkpoint + fold.to(torch.int64)  # [B]
        self._write(checkpoint, rows)
        self.checkpoint.copy_(checkpoint)

    def _write(self, checkpoint: torch.Tensor, rows: torch.Tensor | None) -> None:
        """Both stored copies of rows `rows` (None: all) rounded from fold_out at the checkpoint indices [B]."""
        cfg = self.config
        if self.fold_out is not self.hi:  # an FP32 recurrence copy holds its folds already
            self._round(cfg.recur_format, RECUR_COPY, checkpoint, rows, self.hi, self.packed if cfg.shared else None)
        if not cfg.shared:
            self._round(cfg.read_format, READ_COPY, checkpoint, rows, self.lo, self.packed)

    def _round(self, fmt, copy: int, checkpoint: torch.Tensor, rows: torch.Tensor | None, decoded: torch.Tensor,
               packed: PackedState | None) -> None:
        """Encode fold_out's rows `rows` (None: all) in `fmt` with copy `copy`'s Philox keys into `packed`'s fields
        (None: the encoding is not kept) and its decoding into `decoded`, in place: one Triton launch where
        the format has a kernel codec, else torch's encode, decode and selects. A copy with error feedback rounds
        fold_out plus its residual and keeps the new residual (as `write_checkpoint`), in the rows `rows` too."""
        keys = self.keys[copy] if fmt.is_stochastic else None
        target = self.fold_out + self.residual[copy] if fmt.feedback else self.fold_out  # [B, H, P, N]
        if fmt.kernel_codec is not None:
            encode_triton(target, fmt, keys, checkpoint, take=rows, out=packed, decoded=decoded)
        else:
            new = encode_target(target, fmt, keys, checkpoint)
            _put(decoded, fmt.decode(new), rows)
            for name in PackedState.FIELDS if packed is not None else ():
                old = getattr(packed, name)
                if old is not None:
                    _put(old, getattr(new, name), rows)
        if fmt.feedback:  # decoded holds the new copy in the rows that rounded
            _put(self.residual[copy], fmt.residual(target, decoded), rows)


def _copy_keys(config: ReplayConfig, layer: int, seq_ids: torch.Tensor) -> torch.Tensor:
    """[2, B] int64: the Philox keys of the recurrence and the read copy of sequences seq_ids [B] (on the device)."""
    return torch.stack([sr_keys_device(config.seed, layer, seq_ids, RECUR_COPY),
                        sr_keys_device(config.seed, layer, seq_ids, READ_COPY)])


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

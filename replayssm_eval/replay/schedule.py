"""Flush schedules: where checkpoints are written and which copy each token's output reads.

Every kernel family (and every backend) takes their schedule from here, so the step reference,
the chunked form and the Triton kernels agree on window phases by construction.

A `TokenPlan` covers one call of T tokens for B sequences:
- `fold_after[b, n]`: after token n the buffer (every entry since the newest checkpoint, token n
  included) is folded into the recurrence copy and a checkpoint is written (both copies, rounded).
- `read_hi[b, n]`: token n's output reads the recurrence copy S_hi of the newest checkpoint
  written before it (flush-step outputs); otherwise it reads the read copy S_lo.
Token n always reads the newest checkpoint written before it, plus the buffered entries since
that checkpoint (token n's own entry included).

Fixed window (docs/semantics.md, "Decode semantics"): decode step n after the anchor has in-window position
j = (h0 + n) mod L; j = L-1 is the flush: it folds the L entries and its output comes from the
folded state before rounding, i.e. S_hi of the previous checkpoint plus the L buffered entries.

Speculative (`SpeculativeFlush`): each step appends T entries and commits a prefix of
1..T of them. When, after a step, h + T > L (h committed entries), the committed entries are
folded at once (the decision needs only h and T, "early flush") and the next step's outputs read
the freshly written S_hi. A call may end in the middle of a step; `ScheduleState` carries the rest.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.replay.host_values import host_copy, remember_host, to_host


@dataclass(frozen=True)
class ScheduleState:
    """Per-sequence schedule position, carried between calls.

    count: [B] int64, committed entries in the buffer since the newest checkpoint (h).
    step_left: [B] int64, tokens of the current speculative step not yet consumed (0 = at a step boundary).
    step_read_hi: [B] bool, the current (or, at a boundary, the next) speculative step reads S_hi.
    steps: [B] int64, speculative steps started so far (the acceptance draws are keyed by it).
    """

    count: torch.Tensor
    step_left: torch.Tensor
    step_read_hi: torch.Tensor
    steps: torch.Tensor

    @classmethod
    def start(cls, batch: int, device=None) -> "ScheduleState":
        """The position right after a prefill wrote the first checkpoint (known to the host: `host_values`)."""
        zeros = torch.zeros(batch, dtype=torch.int64, device=device)
        state = cls(zeros, zeros.clone(), torch.zeros(batch, dtype=torch.bool, device=device), zeros.clone())
        for t in state.fields():
            remember_host(t, [False if t.dtype == torch.bool else 0] * batch)
        return state

    def fields(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(count, step_left, step_read_hi, steps)."""
        return self.count, self.step_left, self.step_read_hi, self.steps


@dataclass(frozen=True)
class PlanShape:
    """A plan's segments as the host knows them, without reading the device: the entries buffered at the call's
    start, the checkpoints each sequence writes, and the entries (buffered ones included) up to and including the
    last token of the longest segment that holds a token (0 for a call without tokens)."""

    counts: tuple[int, ...]  # [B]
    num_folds: tuple[int, ...]  # [B]
    longest: int


@dataclass(frozen=True)
class TokenPlan:
    fold_after: torch.Tensor  # [B, T] bool
    read_hi: torch.Tensor  # [B, T] bool
    shape: PlanShape | None = None  # None where the schedule's counts are known only on the device

    @property
    def anchor(self) -> torch.Tensor:
        """[B, T] int64: index of the checkpoint each token reads (0 = the newest at call start)."""
        folds = self.fold_after.to(torch.int64)
        return folds.cumsum(dim=1) - folds

    @property
    def num_folds(self) -> torch.Tensor:
        """[B] int64: checkpoints written during the call."""
        return self.fold_after.sum(dim=1)


def accepted_per_step(seed: int, sequence: int, step: int, drafts: int, accept: float) -> int:
    """Committed entries of one speculative step: 1 + leading successes of T-1 Bernoulli(accept) draws.

    Keyed by (seed, sequence, step) alone, so a run split across calls draws the same numbers.
    """
    rng = random.Random(f"accept:{seed}:{sequence}:{step}")
    committed = 1
    while committed < drafts and rng.random() < accept:
        committed += 1
    return committed


def plan_tokens(
    config: ReplayConfig, state: ScheduleState, num_tokens: int, seq_ids: torch.Tensor
) -> tuple[TokenPlan, ScheduleState]:
    """Plan `num_tokens` decode tokens for every sequence from `state`; returns the plan and the state after."""
    if config.speculative is None:
        return _plan_window(config.window, state, num_tokens)
    return _plan_speculative(config, state, num_tokens, seq_ids)


def _plan_window(window: int, state: ScheduleState, num_tokens: int) -> tuple[TokenPlan, ScheduleState]:
    device = state.count.device
    position = state.count[:, None] + torch.arange(num_tokens, device=device)  # [B, T]
    fold = position % window == window - 1
    after = ScheduleState((state.count + num_tokens) % window, state.step_left, state.step_read_hi, state.steps)
    counts = host_copy(state.count)
    shape = None
    if counts is not None:
        shape = _window_shape(window, counts, num_tokens)
        remember_host(after.count, [(c + num_tokens) % window for c in counts])
    return TokenPlan(fold_after=fold, read_hi=fold.clone(), shape=shape), after


def _window_shape(window: int, counts: list[int], num_tokens: int) -> PlanShape:
    """`PlanShape` of a fixed-window plan: token n of a sequence holding c entries folds where (c + n) % window is
    window - 1."""
    num_folds, longest = [], 0
    for c in counts:
        folds = (c + num_tokens) // window - c // window
        if folds:  # the first segment ends at the first folding token; every later one holds at most a window
            size = c + (window - 1 - c) % window + 1
        else:
            size = c + num_tokens if num_tokens else 0
        num_folds.append(folds)
        longest = max(longest, size)
    return PlanShape(tuple(counts), tuple(num_folds), longest)


def _plan_speculative(
    config: ReplayConfig, state: ScheduleState, num_tokens: int, seq_ids: torch.Tensor
) -> tuple[TokenPlan, ScheduleState]:
    spec, window = config.speculative, config.window
    batch = state.count.shape[0]
    fold = torch.zeros(batch, num_tokens, dtype=torch.bool)
    read_hi = torch.zeros(batch, num_tokens, dtype=torch.bool)
    count, left, hi, steps = (list(to_host(t)) for t in state.fields())
    sequences = to_host(seq_ids)
    counts, longest = tuple(count), 0
    for b in range(batch):
        for n in range(num_tokens):
            if left[b] == 0:  # a new step starts at token n
                left[b] = accepted_per_step(config.seed, int(sequences[b]), steps[b], spec.drafts, spec.accept)
                steps[b] += 1
            read_hi[b, n] = hi[b]
            count[b] += 1
            longest = max(longest, count[b])
            left[b] -= 1
            if left[b] == 0:  # the step ends: early flush if the next step might overflow the window
                hi[b] = count[b] + spec.drafts > window
                if hi[b]:
                    fold[b, n] = True
                    count[b] = 0
    device = state.count.device
    to_device = lambda t: t.to(device, non_blocking=True)  # noqa: E731  from host memory: no wait for the GPU
    after = ScheduleState(*(to_device(torch.tensor(v, dtype=t.dtype)) for v, t in zip((count, left, hi, steps),
                                                                                        state.fields())))
    for v, t in zip((count, left, hi, steps), after.fields()):
        remember_host(t, v)
    shape = PlanShape(counts, tuple(int(f) for f in fold.sum(1).tolist()), longest)
    return TokenPlan(fold_after=to_device(fold), read_hi=to_device(read_hi), shape=shape), after


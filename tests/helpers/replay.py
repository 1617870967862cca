"""The config grid of the reference tests and ReplayState plumbing: stacking per-sequence states, moving to a device."""

import dataclasses

import torch

from replayssm_eval.replay.schedule import ScheduleState
from replayssm_eval.replay.state import ReplayState

from tests.helpers.compare import SCHEDULE_FIELDS

CONFIGS = ["fp32", "shared:nvfp4", "nvfp4/fp16sr", "nvfp4/fp8sr", "fp16/fp32"]
WINDOWS = [1, 4, 16]


def stack_states(states: list[ReplayState]) -> ReplayState:
    """Concatenate single-sequence ReplayStates along the batch (continuous batching; their phases may differ).

    A shared read copy stays the same tensor as S_hi; the packed read copies are stacked when every state has one."""
    cat = lambda get: torch.cat([get(s) for s in states])  # noqa: E731
    first = states[0]
    hi = cat(lambda s: s.hi)
    lo = hi if first.lo is first.hi else cat(lambda s: s.lo)
    schedule = ScheduleState(*(cat(lambda s, f=f: getattr(s.schedule, f)) for f in SCHEDULE_FIELDS))
    packed = None
    if all(s.lo_packed is not None for s in states):
        fields = {f: None if getattr(first.lo_packed, f) is None else cat(lambda s, f=f: getattr(s.lo_packed, f))
                  for f in type(first.lo_packed).FIELDS}
        packed = dataclasses.replace(first.lo_packed, shape=(len(states), *first.lo_packed.shape[1:]), **fields)
    return ReplayState(hi, lo, {k: cat(lambda s, k=k: s.buffer[k]) for k in first.buffer}, schedule,
                       cat(lambda s: s.checkpoint), cat(lambda s: s.seq_ids), first.layer, packed,
                       {c: cat(lambda s, c=c: s.residual[c]) for c in first.residual})


def state_to(state: ReplayState, device) -> ReplayState:
    """The state with all its tensors on `device`; a shared read copy stays the same tensor as S_hi."""
    hi = state.hi.to(device)
    packed = state.lo_packed
    if packed is not None:
        packed = dataclasses.replace(packed, **{f: None if getattr(packed, f) is None else getattr(packed, f).to(device)
                                                for f in type(packed).FIELDS})
    return dataclasses.replace(
        state, hi=hi, lo=hi if state.lo is state.hi else state.lo.to(device), checkpoint=state.checkpoint.to(device),
        seq_ids=state.seq_ids.to(device), buffer={k: v.to(device) for k, v in state.buffer.items()},
        schedule=ScheduleState(*(getattr(state.schedule, f).to(device) for f in SCHEDULE_FIELDS)), lo_packed=packed,
        residual={c: t.to(device) for c, t in state.residual.items()})

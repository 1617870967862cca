"""Rows of a running generation batch: keep some rows of a session, or join sessions into one batch.

A session's batch lives in its HF cache (attention KV [B, H, T, D] in each layer's `keys` and
`values`; conv and recurrent states [B, ...] in dicts), its SSM states (`ReplayState`: every
tensor leads with the batch dim, a `PackedState` too, its `shape` included), its seq_ids [B] and
its attention mask [B, tokens]. Sessions of different lengths are joined by left-padding the
shorter ones' KV caches and masks: a padded column is masked out of attention, and positions come
from the mask (`ReplayModel.forward`), so a row's numbers do not depend on the rows it shares a
batch with (up to the summation order of batched matmuls). Window phases are per row already
(`ScheduleState`), so rows at different phases share a batch.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from replayssm_eval.formats.packed import PackedState
from replayssm_eval.models.session import ReplaySession

KV_ATTRS = ("keys", "values")  # cache layer tensors [B, H, T, D] whose dim -2 is the token axis


def keep_rows(session: ReplaySession, rows: list[int]) -> None:
    """Keep only `rows` of the session's batch, in that order; drop leading KV columns no kept row uses."""
    carried = session.carried()
    index = torch.tensor(rows, dtype=torch.long)
    pick = lambda ts: ts[0][index.to(ts[0].device)]  # noqa: E731
    mask = None if carried["attention_mask"] is None else pick([carried["attention_mask"]])
    session.continue_from({"cache": _cache([carried["cache"]], pick), "states": _tree([carried["states"]], pick),
                           "tokens": carried["tokens"], "attention_mask": mask})
    session.seq_ids = session.seq_ids[index]
    _trim(session)


def join(sessions: list[ReplaySession]) -> ReplaySession:
    """One session holding the rows of `sessions` in order (the first one is reused); KV left-padded to the longest."""
    width = max(s.tokens for s in sessions)
    parts = [_padded(s, width) for s in sessions]
    if len({tuple(sorted(p["states"])) for p in parts}) != 1:
        raise ValueError("cannot join sessions whose SSM layers are at different stages (anchor vs ReplayState)")
    cat = lambda ts: torch.cat([t.to(ts[0].device) for t in ts])  # noqa: E731
    joined = sessions[0]
    joined.continue_from({"cache": _cache([p["cache"] for p in parts], cat), "states": _tree([p["states"] for p in parts], cat),
                          "tokens": width, "attention_mask": cat([p["attention_mask"] for p in parts])})
    joined.seq_ids = torch.cat([s.seq_ids for s in sessions])
    return joined


def _padded(session: ReplaySession, width: int) -> dict:
    """The session's carried state with its KV and mask left-padded to `width` tokens (a copy where padded)."""
    carried = session.carried()
    mask = carried["attention_mask"]
    batch = session.seq_ids.shape[0]
    if mask is None:
        mask = torch.ones(batch, session.tokens, dtype=torch.long)
    pad = width - session.tokens
    if pad:
        mask = torch.cat([torch.zeros(batch, pad, dtype=mask.dtype, device=mask.device), mask], dim=1)
        carried["cache"] = _cache([carried["cache"]], lambda ts: ts[0], kv=lambda t: _pad_tokens(t, pad))
    carried["attention_mask"] = mask
    return carried


def _trim(session: ReplaySession) -> None:
    """Drop the leading token columns that every row has masked out."""
    mask = session.attention_mask
    if mask is None:
        return
    used = mask.any(dim=0).nonzero()
    start = int(used[0]) if len(used) else mask.shape[1]
    if start == 0:
        return
    session.cache = _cache([session.cache], lambda ts: ts[0], kv=lambda t: t[..., start:, :])
    session.attention_mask = mask[:, start:]
    session.tokens -= start
    session.continue_from(session.carried())  # re-attach the new cache object to the session


def _pad_tokens(t: torch.Tensor, pad: int) -> torch.Tensor:
    """KV [B, H, T, D] with `pad` zero columns in front of T."""
    return torch.cat([t.new_zeros(*t.shape[:-2], pad, t.shape[-1]), t], dim=-2)


def _cache(caches: list, combine, kv=None):
    """A shallow copy of caches[0] whose layers combine the layers of `caches` (`kv` first maps each KV tensor)."""
    out = copy.copy(caches[0])
    layers = []
    for group in zip(*(c.layers for c in caches)):
        layer = copy.copy(group[0])
        for name, value in vars(group[0]).items():
            values = [vars(g)[name] for g in group]
            if name in KV_ATTRS and torch.is_tensor(value) and kv is not None:
                values = [kv(v) for v in values]
            setattr(layer, name, _tree(values, combine))
        layers.append(layer)
    out.layers = layers
    return out


def _tree(objs: list, combine):
    """combine(list of tensors) over matching tensors of `objs` (dicts, lists, tuples, dataclasses, PackedState)."""
    first = objs[0]
    if torch.is_tensor(first) and first.dim() == 0:  # a whole cache layer's, not a row's (`session.set_cache_length`)
        return first.clone()
    if torch.is_tensor(first):
        return combine(objs)
    if isinstance(first, dict):
        return {k: _tree([o[k] for o in objs], combine) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(_tree(list(group), combine) for group in zip(*objs))
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        out = dataclasses.replace(first, **{f.name: _tree([getattr(o, f.name) for o in objs], combine)
                                            for f in dataclasses.fields(first) if f.init})
        if isinstance(out, PackedState):  # every field is rebuilt; the encoded shape leads with the batch too
            out = dataclasses.replace(out, shape=(out.data.shape[0], *first.shape[1:]))
        return out
    return first  # ints, strings, dtypes, devices, None: the same for every row

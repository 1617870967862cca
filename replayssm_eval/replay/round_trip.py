"""`RoundTrip`: the state stored in a format and restored at chosen token positions (a config's `#rt=` option).

    #rt=FORMAT@prompt         at the end of the prompt (a prefix-cache hit)
    #rt=FORMAT@every:N        at positions N, 2N, 3N, ... (a paged prefix cache with N-token pages)
    #rt=FORMAT@at:P1,P2,...   at the listed positions

A position counts the row's real tokens consumed so far, prompt included: a round trip at p replaces
the state after p tokens, the one that predicts token p + 1. FORMAT is a state format spec
(`formats.get_format`), e.g. `int8:axis=headdim,scale=row` (SGLang's INT8 checkpoint pool: one scale
per key channel). What the round trip does to the state is docs/semantics.md, "State round trips".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

POINTS = "prompt, every:N, at:P1,P2,..."


@dataclass(frozen=True)
class RoundTrip:
    """fmt: the format spec the state is stored in; prompt: at the prompt's end; every: N (0: none);
    at: the listed positions (sorted, each >= 1)."""

    fmt: str
    prompt: bool = False
    every: int = 0
    at: tuple[int, ...] = ()

    def __post_init__(self):
        from replayssm_eval.formats import get_format

        object.__setattr__(self, "fmt", get_format(self.fmt).name)
        if self.every < 0 or (self.every == 0 and not self.prompt and not self.at):
            raise ValueError(f"round-trip points every={self.every}, at={list(self.at)}: accepted: {POINTS}")
        if any(p < 1 for p in self.at) or list(self.at) != sorted(set(self.at)):
            raise ValueError(f"round-trip positions {list(self.at)}; accepted: increasing integers >= 1")

    @property
    def format(self):
        from replayssm_eval.formats import get_format

        return get_format(self.fmt)

    @property
    def name(self) -> str:
        if self.prompt:
            points = "prompt"
        elif self.every:
            points = f"every:{self.every}"
        else:
            points = "at:" + ",".join(map(str, self.at))
        return f"{self.fmt}@{points}"

    def hits(self, positions: torch.Tensor, points: torch.Tensor | None = None) -> torch.Tensor:
        """[...] bool: where positions ([...] int64, real tokens consumed) are round-trip points (the prompt's end is
        not a position: `ReplaySession` applies it at the layer's anchor). points: `points(device)`, made once by a
        caller that copies nothing from the host here (a step captured in a CUDA graph)."""
        hit = torch.zeros_like(positions, dtype=torch.bool)
        if self.every:
            hit |= (positions > 0) & (positions % self.every == 0)
        if self.at:
            at = self.points(positions.device) if points is None else points
            hit |= (positions[..., None] == at).any(dim=-1)
        return hit

    def points(self, device) -> torch.Tensor:
        """[K] int64: the listed positions `at` on `device`."""
        return torch.tensor(self.at, dtype=torch.int64, device=device)

    @classmethod
    def parse(cls, text: str) -> "RoundTrip":
        """`FORMAT@prompt`, `FORMAT@every:N` or `FORMAT@at:P1,P2`; ValueError naming the value otherwise."""
        fmt, at, points = text.rpartition("@")
        if not at or not fmt:
            raise ValueError(f"round trip {text!r} has no points; accepted: FORMAT@{{{POINTS}}}, e.g. int8@prompt")
        kind, _, value = points.partition(":")
        if kind == "prompt" and not value:
            return cls(fmt, prompt=True)
        if kind == "every":
            return cls(fmt, every=_positive(value, points))
        if kind == "at":
            return cls(fmt, at=tuple(_positive(v, points) for v in value.split(",")))
        raise ValueError(f"bad round-trip points {points!r}; accepted: {POINTS}")


def _positive(text: str, points: str) -> int:
    if not (text.isdigit() and text.isascii()) or int(text) < 1:
        raise ValueError(f"bad round-trip points {points!r}: {text!r} is not an integer >= 1; accepted: {POINTS}")
    return int(text)

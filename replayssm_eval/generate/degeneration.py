"""Degenerate generations: a tail that repeats one span over and over (a loop).

On token ids: a generation loops when, for some span length p in 1..MAX_SPAN, its last
n = max(MIN_REPEATS * p, MIN_TAIL) tokens are periodic with period p (token i equals token i + p
throughout those n tokens): at least MIN_REPEATS full copies of one span and at least MIN_TAIL
tokens of pure repetition at the very end. A generation shorter than n is not a loop at that p.

MIN_TAIL = 64 keeps short runs of a repeated character or token ("----", "1111", a few equal
table rows) from counting; MIN_REPEATS = 4 asks for a span said four times in a row, which
normal text does not do; MAX_SPAN = 100 tokens covers a repeated sentence or short paragraph.
"""

from __future__ import annotations

import numpy as np

MIN_TAIL = 64
MIN_REPEATS = 4
MAX_SPAN = 100


def loop_span(tokens) -> int | None:
    """The shortest span length p whose repetition fills the generation's tail (see the module docstring), or None."""
    ids = np.asarray(tokens, dtype=np.int64)
    for p in range(1, MAX_SPAN + 1):
        n = max(MIN_REPEATS * p, MIN_TAIL)
        if n > ids.size:
            break
        tail = ids[-n:]
        if np.array_equal(tail[p:], tail[:-p]):
            return p
    return None


def is_loop(tokens) -> bool:
    return loop_span(tokens) is not None

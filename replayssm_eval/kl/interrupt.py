"""Ctrl-C during a KL run: the first one stops the run at the next segment boundary, a second one at once.

The streams' state (HF caches, ReplayStates) is updated in place during a segment, so it is
consistent only between segments; copying it every segment would cost as much memory as the
state itself (GBs at 128K tokens). Instead the first SIGINT only sets a flag; the driver checks
it at every segment boundary, saves a snapshot of the batch in flight there, and raises
KeyboardInterrupt. A second SIGINT raises KeyboardInterrupt at once (no snapshot: the batch in
flight then restarts on `--resume`).
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

FIRST_MESSAGE = (b"\nCtrl-C: stopping after the current segment, where the batch in flight is saved; "
                 b"press Ctrl-C again to stop at once (that batch then restarts on --resume)\n")


class DeferredInterrupt:
    """A SIGINT handler: the first signal sets `requested`, the second raises KeyboardInterrupt."""

    def __init__(self):
        self.requested = False

    def __call__(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        os.write(2, FIRST_MESSAGE)  # unbuffered: the signal may arrive inside a buffered write to stderr

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C was deferred."""
        if self.requested:
            raise KeyboardInterrupt


@contextmanager
def deferred_interrupt():
    """Defer Ctrl-C within the block (see `DeferredInterrupt`); outside the main thread signals are left alone."""
    handler = DeferredInterrupt()
    if threading.current_thread() is not threading.main_thread():
        yield handler
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield handler
    finally:
        # None: the previous handler was not set from Python; Python's own is the nearest
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)

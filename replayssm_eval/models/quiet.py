"""Known third-party noise, dropped where it is logged and only while our calls run (`quiet_logs`).

Each entry is a logger and message fragments of lines that say nothing a user can act on; every other
record of those loggers, and every warning of ours, still shows:

    torchao                 its compiled extensions built for other GPUs or Python versions fail to load
                            (imported by transformers' quantizer registry while a model loads)
    torch.utils._pytree     torchao registers Enums as pytree constants, deprecated in torch 2.13
    transformers.integrations.hub_kernels   causal_conv1d falls back to its PyTorch reference (the
                            convolution only: the SSM scans run on our kernels)

Transformers' "Loading weights" progress bar is switched off for the same span.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

MODEL_NOISE = {
    "torchao": ("Failed to load ",),
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported by torch.compile",),
    "transformers.integrations.hub_kernels": ("is falling back to its reference PyTorch implementation",),
}


class DropKnown(logging.Filter):
    """Drops the records whose message contains one of `fragments`."""

    def __init__(self, fragments: tuple[str, ...]):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


@contextmanager
def quiet_logs(noise: dict[str, tuple[str, ...]] = MODEL_NOISE):
    """Within the block, the loggers of `noise` drop their known lines, and transformers shows no progress bars."""
    from transformers.utils import logging as hf_logging

    filters = [(logging.getLogger(name), DropKnown(fragments)) for name, fragments in noise.items()]
    for logger, drop in filters:
        logger.addFilter(drop)
    bars_were_off = not hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not bars_were_off:
            hf_logging.enable_progress_bar()
        for logger, drop in filters:
            logger.removeFilter(drop)

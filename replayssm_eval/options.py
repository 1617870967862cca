"""Fields of the config dataclasses that the `replayssm-eval` options are generated from (`cli`).

    @dataclass(frozen=True)
    class KLConfig:
        tokens: int = option(2048, "generated tokens per document")

A field's default, its `metadata["help"]` and, optionally, `metadata["choices"]` become the option's
default, --help text and accepted values. A driver takes its config dataclass without the command line.
"""

from __future__ import annotations

import dataclasses


def option(default, help: str, choices: tuple | None = None):
    """A config-dataclass field for a subcommand: its default, its --help text and, optionally, the accepted values."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": choices}
    if isinstance(default, tuple):
        return dataclasses.field(default_factory=lambda: default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def resolve_device(device: str) -> str:
    """A `--device` value as given, or for `auto` cuda where a CUDA device is available, else cpu; cuda where none
    is available is a ValueError."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is available; accepted here: --device cpu or auto")
    return device

"""The one registry of state formats and the spec-string parser (`get_format("nvfp4:axis=headdim")`).

Grammar: `name[:key=value,...]`. Each format lists its accepted values per key (`options_for`), the
default first; a listed value ending in `N` (`N`, `block:N`, `hadamard:N`) accepts a positive integer
in place of the `N` (no sign, no leading zero). `rot=hadamard:N` applies to every format (`Rotated`).
"""

from __future__ import annotations

from replayssm_eval.formats.formats import ElementwiseFormat, FP8Format, IntFormat, MXFormat, NVFP4Format, StateFormat
from replayssm_eval.formats.rotation import ROTATIONS, Rotated

# name -> format class; the class's `options_for(name)` give the accepted options
FORMATS: dict[str, type[StateFormat]] = {
    "fp32": ElementwiseFormat,
    "bf16": ElementwiseFormat,
    "fp16": ElementwiseFormat,
    "fp16sr": ElementwiseFormat,
    "int16": IntFormat,
    "int16sr": IntFormat,
    "fp8": FP8Format,
    "fp8sr": FP8Format,
    "fp8e5m2": FP8Format,
    "int8": IntFormat,
    "int8sr": IntFormat,
    "nvfp4": NVFP4Format,
    "mxfp8": MXFormat,
    "mxfp4": MXFormat,
}


def list_formats() -> list[str]:
    """Names of all formats, cheapest-to-read last."""
    return list(FORMATS)


def accepts(pattern: str, value: str) -> bool:
    """Whether `value` matches an accepted value: literally, or with a positive integer in place of a final `N`."""
    if not pattern.endswith("N"):
        return value == pattern
    head, digits = pattern[:-1], value[len(pattern) - 1:]
    return value.startswith(head) and digits.isdigit() and digits.isascii() and digits[0] != "0"


def get_format(spec: str) -> StateFormat:
    """Parse `name[:key=value,...]` into a frozen format instance; bad names and options raise ValueError."""
    name, _, opts = spec.strip().partition(":")
    if name not in FORMATS:
        raise ValueError(f"unknown state format '{name}'; known: {', '.join(FORMATS)}")
    cls = FORMATS[name]
    accepted = {**cls.options_for(name), "rot": ROTATIONS}
    values: dict[str, str] = {}
    for item in filter(None, (o.strip() for o in opts.split(","))):
        key, eq, value = item.partition("=")
        if key not in accepted:
            raise ValueError(f"unknown option '{key}' for state format '{name}'; accepted: {', '.join(accepted)}")
        if not eq or not any(accepts(p, value) for p in accepted[key]):
            raise ValueError(f"bad value '{value}' for option '{key}' of state format '{name}'; "
                             f"accepted: {', '.join(accepted[key])}")
        values[key] = value
    rot = values.pop("rot", ROTATIONS[0])
    fmt = cls(base=name, **values)
    return fmt if rot == ROTATIONS[0] else Rotated(fmt, int(rot.partition(":")[2]))

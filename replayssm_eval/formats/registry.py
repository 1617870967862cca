"""The one registry of state formats and the spec-string parser (`get_format("nvfp4:axis=headdim")`).

Grammar: `name[:key=value,...]`. Each format lists its accepted values per key (`options_for`), the
default first; in a listed value, `N` (`N`, `block:N`, `hadamard:N`) stands for a positive integer and
`R`, `C` (`tile:RxC`) for an integer >= 0 (0: the whole axis), all without sign or leading zero.
`rot=hadamard:N` (`Rotated`) and `ef=fp32|bf16` (error feedback, `Feedback`) apply to every format.
"""

from __future__ import annotations

import re

from replayssm_eval.formats.formats import ElementwiseFormat, FP8Format, IntFormat, MXFormat, NVFP4Format, StateFormat
from replayssm_eval.formats.dual_axis import DualAxisFormat
from replayssm_eval.formats.feedback import FEEDBACK, Feedback
from replayssm_eval.formats.microexponent import MicroexponentFormat
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
    "mx8": MicroexponentFormat,
    "mx8sr": MicroexponentFormat,
    "dualaxis": DualAxisFormat,
    "nvfp4": NVFP4Format,
    "mxfp8": MXFormat,
    "mxfp4": MXFormat,
}


def list_formats() -> list[str]:
    """Names of all formats, cheapest-to-read last."""
    return list(FORMATS)


# the placeholders of accepted values and the digits each stands for
_PLACEHOLDERS = {"N": "[1-9][0-9]*", "R": "(?:0|[1-9][0-9]*)", "C": "(?:0|[1-9][0-9]*)"}


def accepts(pattern: str, value: str) -> bool:
    """Whether `value` matches an accepted value: literally, with integers in place of the placeholders (`N`, `R`, `C`)."""
    regex = "".join(_PLACEHOLDERS.get(ch, re.escape(ch)) for ch in pattern)
    return re.fullmatch(regex, value) is not None


def get_format(spec: str) -> StateFormat:
    """Parse `name[:key=value,...]` into a frozen format instance; bad names and options raise ValueError."""
    name, _, opts = spec.strip().partition(":")
    if name not in FORMATS:
        raise ValueError(f"unknown state format '{name}'; known: {', '.join(FORMATS)}")
    cls = FORMATS[name]
    accepted = {**cls.options_for(name), "rot": ROTATIONS, "ef": FEEDBACK}
    values: dict[str, str] = {}
    for item in filter(None, (o.strip() for o in opts.split(","))):
        key, eq, value = item.partition("=")
        if key not in accepted:
            raise ValueError(f"unknown option '{key}' for state format '{name}'; accepted: {', '.join(accepted)}")
        if not eq or not any(accepts(p, value) for p in accepted[key]):
            raise ValueError(f"bad value '{value}' for option '{key}' of state format '{name}'; "
                             f"accepted: {', '.join(accepted[key])}")
        values[key] = value
    rot, ef = values.pop("rot", ROTATIONS[0]), values.pop("ef", FEEDBACK[0])
    fmt = cls(base=name, **values)
    fmt = fmt if rot == ROTATIONS[0] else Rotated(fmt, int(rot.partition(":")[2]))
    return fmt if ef == FEEDBACK[0] else Feedback(fmt, ef)

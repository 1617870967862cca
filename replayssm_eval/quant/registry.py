"""The one registry of state formats and the spec-string parser (`get_format("nvfp4:axis=headdim")`)."""

from __future__ import annotations

from replayssm_eval.quant.formats import ElementwiseFormat, FP8Format, MXFormat, NVFP4Format, StateFormat

# name -> format class; the class's `OPTIONS` give the accepted options
FORMATS: dict[str, type[StateFormat]] = {
    "fp32": ElementwiseFormat,
    "bf16": ElementwiseFormat,
    "fp16": ElementwiseFormat,
    "fp16sr": ElementwiseFormat,
    "fp8": FP8Format,
    "fp8sr": FP8Format,
    "fp8e5m2": FP8Format,
    "nvfp4": NVFP4Format,
    "mxfp8": MXFormat,
    "mxfp4": MXFormat,
}


def list_formats() -> list[str]:
    """Names of all formats, cheapest-to-read last."""
    return list(FORMATS)


def get_format(spec: str) -> StateFormat:
    """Parse `name[:key=value,...]` into a frozen format instance; bad names and options raise ValueError."""
    name, _, opts = spec.strip().partition(":")
    if name not in FORMATS:
        raise ValueError(f"unknown state format '{name}'; known: {', '.join(FORMATS)}")
    cls = FORMATS[name]
    accepted = cls.OPTIONS
    values: dict[str, str] = {}
    for item in filter(None, (o.strip() for o in opts.split(","))):
        key, eq, value = item.partition("=")
        if key not in accepted:
            known = ", ".join(accepted) if accepted else "none"
            raise ValueError(f"unknown option '{key}' for state format '{name}'; accepted: {known}")
        if not eq or value not in accepted[key]:
            raise ValueError(f"bad value '{value}' for option '{key}' of state format '{name}'; "
                             f"accepted: {', '.join(accepted[key])}")
        values[key] = value
    return cls(base=name, **values)

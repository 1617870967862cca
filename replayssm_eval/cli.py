"""The `replayssm-eval` command.

Each subcommand is one config dataclass plus one public function. The options are generated
from the dataclass fields (type, default, and `metadata["help"]`, see `options.option`), so they are
spelled once. Subcommands register themselves with `@command` in their module of `commands/`; the
parser imports only the module of the subcommand named on the command line, so `replayssm-eval
--help` imports none and `replayssm-eval kl --help` only the light `commands.kl` (no torch).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import types
import typing
from typing import Any, Callable

# subcommand name -> (module that registers it with @command, one-line help)
SUBCOMMANDS = {
    "formats": ("replayssm_eval.commands.formats", "bits, bytes per SSM state and round-trip error of each state format"),
    "kl": ("replayssm_eval.commands.kl",
           "teacher-forced KL of SSM state formats against the FP32-state reference, by generated length"),
    "sensitivity": ("replayssm_eval.commands.sensitivity",
                    "per SSM layer and head: KL when only it uses a config, and when only it stays FP32"),
    "accuracy": ("replayssm_eval.commands.accuracy",
                 "downstream accuracy (GPQA-Diamond, MMLU-Pro, MATH L5) of state formats vs FP32, by FP32 length bucket"),
    "regress": ("replayssm_eval.commands.regress",
                "deterministic numerics regression suite against a committed baseline; "
                "--kernel checks an external decode kernel against the reference"),
    "report": ("replayssm_eval.commands.report",
               "render KL and accuracy results as a self-contained HTML page and a Markdown file"),
}

_REGISTRY: dict[str, tuple[type, Callable[[Any], int | None]]] = {}


def command(name: str):
    """Register `fn(config) -> exit code` as subcommand `name`; its first parameter's dataclass gives the options."""

    def decorate(fn):
        config_cls = next(iter(typing.get_type_hints(fn).values()))
        _REGISTRY[name] = (config_cls, fn)
        return fn

    return decorate


def _unwrap_optional(tp):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def add_dataclass_arguments(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """Add one `--option` per field of `config_cls` (underscores become dashes); `metadata["positional"]`
    makes a tuple field positional instead."""
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        tp = _unwrap_optional(hints[f.name])
        if f.metadata.get("positional"):  # a tuple field given as positional arguments, one or more
            parser.add_argument(f.name, nargs="+", metavar=f.metadata.get("metavar"), help=f.metadata.get("help", ""))
            continue
        flag = "--" + f.name.replace("_", "-")
        kwargs: dict[str, Any] = {"help": f.metadata.get("help", ""), "dest": f.name}
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default"] = f.default_factory()
        else:
            kwargs["required"] = True
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction  # its help shows the default
        elif typing.get_origin(tp) in (list, tuple):
            kwargs["type"] = typing.get_args(tp)[0]
            kwargs["action"] = "append"
            default = kwargs.get("default") or ()
            kwargs["help"] += f" (repeatable; default: {', '.join(map(str, default))})" if default else " (repeatable)"
            kwargs["default"] = None
        else:
            kwargs["type"] = tp
            if kwargs.get("default") is not None:
                kwargs["help"] += f" (default: {kwargs['default']})"
        parser.add_argument(flag, **kwargs)


def dataclass_from_namespace(config_cls: type, ns: argparse.Namespace):
    """Build `config_cls` from parsed arguments; unset repeatable options keep their default."""
    values = {}
    for f in dataclasses.fields(config_cls):
        value = getattr(ns, f.name)
        if isinstance(value, list):
            values[f.name] = tuple(value)
        elif value is not None or f.default is None:
            values[f.name] = value
    return config_cls(**values)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: only the subcommand it names (its first word) gets its options, and only
    that subcommand's module is imported; with `argv` None, every subcommand gets its options."""
    parser = argparse.ArgumentParser(
        prog="replayssm-eval",
        description="Accuracy and numerics evaluation for ReplaySSM split-precision SSM state.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if argv is None or argv[:1] == [name]:
            importlib.import_module(module)
            add_dataclass_arguments(sp, _REGISTRY[name][0])
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ns = build_parser(argv).parse_args(argv)
    config_cls, fn = _REGISTRY[ns.command]
    try:
        config = dataclass_from_namespace(config_cls, ns)
        code = fn(config)
    except ValueError as err:  # bad input: one clear line, no traceback
        print(f"replayssm-eval {ns.command}: error: {err}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    # run through the package module so @command registers into this registry, not __main__'s
    from replayssm_eval import cli

    sys.exit(cli.main())

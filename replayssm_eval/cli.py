"""The `replayssm-eval` command.

Each subcommand is one config dataclass plus one public function. The options are generated
from the dataclass fields (type, default, and `metadata["help"]`), so they are spelled once.
Subcommands register themselves with `@command` in their own module; `main` imports those
modules lazily so `replayssm-eval --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import types
import typing
from typing import Any, Callable

# subcommand name -> module that registers it with @command
SUBCOMMAND_MODULES = {
    "formats": "replayssm_eval.quant.summary",
    "kl": "replayssm_eval.kl.cli",
    "accuracy": "replayssm_eval.tasks.accuracy",
    "regress": "replayssm_eval.regress.cli",
    "report": "replayssm_eval.reports.cli",
}

_REGISTRY: dict[str, tuple[type, Callable[[Any], int | None], str]] = {}


def command(name: str, help: str):
    """Register `fn(config) -> exit code` as subcommand `name`; its first parameter's dataclass gives the options."""

    def decorate(fn):
        config_cls = next(iter(typing.get_type_hints(fn).values()))
        _REGISTRY[name] = (config_cls, fn, help)
        return fn

    return decorate


def option(default, help: str, choices: tuple | None = None):
    """A config-dataclass field for a subcommand: its default, its --help text and, optionally, the accepted values."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": choices}
    if isinstance(default, tuple):
        return dataclasses.field(default_factory=lambda: default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


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
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(tp) in (list, tuple):
            kwargs["type"] = typing.get_args(tp)[0]
            kwargs["action"] = "append"
            kwargs["help"] += f" (repeatable; default: {', '.join(map(str, kwargs.get('default', ()))) or 'none'})"
            kwargs["default"] = None
        else:
            kwargs["type"] = tp
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replayssm-eval",
        description="Accuracy and numerics evaluation for ReplaySSM split-precision SSM state.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in SUBCOMMAND_MODULES.items():
        importlib.import_module(module)
        config_cls, _, help_text = _REGISTRY[name]
        sp = sub.add_parser(name, help=help_text, description=help_text)
        add_dataclass_arguments(sp, config_cls)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    config_cls, fn, _ = _REGISTRY[ns.command]
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

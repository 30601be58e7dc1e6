"""Options dataclasses are the one source of a command's flags.

Each field of an options dataclass (`PeerOptions`, `CoordinatorOptions`, ...) that a user
may set is declared with `opt(default, help, ...)`; `add_options(parser, cls)` turns those
fields into argparse flags (name, type, default and help all from the field), and
`from_args(cls, args)` builds the dataclass back from the parsed namespace, as Petals'
`run_server` passes its flags straight into `Server(**args)`. A flag is therefore written
once, next to the code that uses it.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, TypeVar

T = TypeVar("T")

_FLAG_KEYS = ("flag", "metavar", "choices", "required", "hidden", "group")


def opt(default: Any = None, help: str = "", *, flag: str | None = None, metavar: str | None = None,
        choices: typing.Sequence[str] | None = None, required: bool = False, hidden: bool = False) -> Any:
    """A dataclass field that is also a command-line flag (`--field-name` unless `flag` says otherwise)."""
    meta = {"help": help, "flag": flag, "metavar": metavar, "choices": choices, "required": required,
            "hidden": hidden}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                exclude: typing.Container[str] = ()) -> None:
    """Add a flag for every `opt()` field of `cls` (fields without help are not flags)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata or f.name in exclude:
            continue
        meta = f.metadata
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        kind = hints[f.name]
        args: dict[str, Any] = {"dest": f.name, "default": default}
        text = meta["help"]
        if meta["hidden"]:
            text = argparse.SUPPRESS
        base = typing.get_origin(kind)
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        if kind is bool:
            args["action"] = argparse.BooleanOptionalAction if default else "store_true"
        elif base is list:
            args["nargs"] = "+"
            args["type"] = typing.get_args(kind)[0]
        else:
            scalar = inner[0] if inner else kind
            if scalar in (int, float):
                args["type"] = scalar
        if meta["metavar"]:
            args["metavar"] = meta["metavar"]
        if meta["choices"]:
            args["choices"] = list(meta["choices"])
        if meta["required"]:
            args["required"] = True
            args.pop("default")
        elif text is not argparse.SUPPRESS and default not in (None, False, [], "") and "(default" not in text:
            shown = " ".join(map(str, default)) if isinstance(default, list) else default
            text = f"{text} (default: {shown})"
        parser.add_argument(_flag_of(f), help=text, **args)


def from_args(cls: type[T], args: argparse.Namespace, **values: Any) -> T:
    """`cls` built from the parsed flags (fields argparse did not set keep their defaults)."""
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in values and hasattr(args, f.name):
            values[f.name] = getattr(args, f.name)
    return cls(**values)

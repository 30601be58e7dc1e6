"""What the `swarm bench` subcommands share in their flags: argument types (comma-separated counts),
the flags most benches take (--out, --smoke, --device, --preset, --data, --dtype, the link), and
--dtype auto resolved; each room's `cli.py` (swarm/bench/ROOM/cli.py) builds its benches' parsers from them."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.spec import DTYPE_CHOICES, PRESETS, resolve_dtype


@dataclass(frozen=True)
class Subcommand:
    """One bench's `swarm bench` subcommand: `add` adds its parser (flags, help) to `swarm bench`'s subparsers and
    returns it; `run` runs the bench with the parsed flags (importing it only then, so `swarm --help` stays fast)."""
    add: Callable[[Any], argparse.ArgumentParser]
    run: Callable[[argparse.Namespace], None]


def resolve_bench_dtype(a: argparse.Namespace) -> None:
    """A bench's --dtype auto, resolved for its --devices' first, else its --device (protocol/spec.py
    `resolve_dtype`)."""
    if getattr(a, "dtype", None) == "auto":
        devices = [d.strip() for d in (getattr(a, "devices", None) or "").split(",") if d.strip()]
        a.dtype = resolve_dtype("auto", devices[0] if devices else getattr(a, "device", None) or "cpu")


def positive_ints(text: str, what: str, example: str, least: int = 1) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what} such as {example}.") \
            from None
    if not values or min(values) < least:
        raise argparse.ArgumentTypeError(f"every one of the {what} must be at least {least}.")
    return values


def steps_list(text: str) -> tuple[int, ...]:
    return positive_ints(text, "numbers of steps", "0,100", least=0)


def ranks_list(text: str) -> tuple[int, ...]:
    return positive_ints(text, "ranks", "4,8")


def sizes_list(text: str) -> tuple[int, ...]:
    return positive_ints(text, "sizes in MB", "1,16")


def add_common(p: argparse.ArgumentParser, device: bool = True) -> None:
    p.add_argument("--out", default="bench-out", metavar="DIR", help="output folder (default: bench-out)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for CI (default: off)")
    if device:
        p.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:0 (default: cpu)")


def add_preset(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--preset", default=default, choices=sorted(PRESETS), help=f"model size (default: {default})")


def add_data(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="stdlib", metavar="PATH",
                   help="corpus: a text file or folder, or stdlib for the Python standard library's sources "
                   "(default: stdlib)")


def add_dtype(p: argparse.ArgumentParser, default: str | None) -> None:
    """--dtype; `default` None: the preset's."""
    said = default or "the preset's"
    p.add_argument("--dtype", default=default, choices=DTYPE_CHOICES, help="compute dtype; auto: bf16 on a CUDA card "
                   f"that has it, fp16 on an older one, fp32 on the CPU (default: {said})")


def add_link(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--bandwidth", default="80mbit", help=f"{what} (default: 80mbit)")
    p.add_argument("--latency", default="0", help="one-way latency on the limited links, e.g. 20ms (default: 0)")

"""How a test double becomes a process: `python -m tests.doubles.NAME COMMAND ARGS` takes `swarm COMMAND ARGS`
(parsed by the product's own parser, so every flag means what it means to `swarm`) plus the double's own flags,
logs as `swarm` does, and runs the command through the product's entry with the double's hook, its failures
told as `swarm` tells them (`run_command`)
(`swarm.cli.cmd_peer(..., on_stage_peer=)`, `cmd_coordinator(..., on_refitter=)`). `LocalSwarm.start_peer`
and `start_coordinator` start one with `module=` (same environment, log file and stop as a stock process)."""
from __future__ import annotations

import argparse
from collections.abc import Callable

from swarm.cli import build_parser, enable_stack_dumps, setup_logging
from swarm.user_errors import debug_wanted, explained


def parse(argv: list[str], own: argparse.ArgumentParser, command: str) -> tuple[argparse.Namespace,
                                                                              argparse.Namespace]:
    """(the double's flags, `swarm COMMAND`'s) from `argv`; logging set up as `swarm` does it."""
    ours, rest = own.parse_known_args(argv)
    args = build_parser().parse_args(rest)
    if args.command != command:
        own.error(f"this double runs `swarm {command}`, not `swarm {args.command}`.")
    setup_logging(args.verbose)
    enable_stack_dumps()
    return ours, args


def own_parser(prog: str) -> argparse.ArgumentParser:
    """A parser for a double's own flags; no abbreviations, so that it never takes one of `swarm`'s."""
    return argparse.ArgumentParser(prog=prog, allow_abbrev=False, add_help=False)


def run_command(command: Callable[[], int]) -> int:
    """`command`'s exit code, its failures told as `swarm` tells them (one sentence; SWARM_DEBUG=1: a traceback)."""
    return explained(command, debug_wanted([])[0])

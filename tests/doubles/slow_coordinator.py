"""`swarm coordinator` that waits before it computes and publishes each basis update (a slow or loaded
coordinator: a test needs an update to appear while a peer is down), as a process of its own:

    python -m tests.doubles.slow_coordinator coordinator ARGS... --refit-delay SECONDS

ARGS are `swarm coordinator`'s; the stock coordinator runs, its basis re-fitter wrapped through
`run_coordinator`'s extension point. A test starts it with
`LocalSwarm.start_coordinator(..., module="tests.doubles.slow_coordinator")`."""
from __future__ import annotations

import asyncio
import sys

from swarm.basis import BasisRefitter
from swarm.cli import cmd_coordinator
from tests.doubles.entry import own_parser, parse, run_command

MODULE = "tests.doubles.slow_coordinator"  # what `LocalSwarm.start_coordinator(module=)` takes


def delay_refits(refitter: BasisRefitter, seconds: float) -> None:
    """Each re-fit of `refitter` starts `seconds` after its statistics agreed."""
    honest = refitter._refit

    async def slow(version: int, step: int, stats: dict) -> None:
        await asyncio.sleep(seconds)  # the delay is what this double is: a coordinator this much slower
        await honest(version, step, stats)
    refitter._refit = slow


def main(argv: list[str] | None = None) -> int:
    own = own_parser("slow_coordinator")
    own.add_argument("--refit-delay", type=float, required=True, metavar="SECONDS",
                     help="seconds each basis update waits before it is computed and published")
    ours, args = parse(sys.argv[1:] if argv is None else argv, own, "coordinator")
    return run_command(lambda: cmd_coordinator(
        args, on_refitter=lambda refitter: delay_refits(refitter, ours.refit_delay)))


if __name__ == "__main__":
    sys.exit(main())

"""`swarm peer` as a hostile donor (`tests/doubles/hostile_donor.py`), as a process of its own:

    python -m tests.doubles.hostile_peer peer ARGS... --serve-bad-state far|near

ARGS are `swarm peer`'s; the stock peer runs, with each stage's `StagePeer` made a hostile donor
through `run_peer`'s extension point. A test starts it with
`LocalSwarm.start_peer(..., module="tests.doubles.hostile_peer")`."""
from __future__ import annotations

import sys

from swarm.cli import cmd_peer
from tests.doubles.entry import own_parser, parse, run_command
from tests.doubles.hostile_donor import AHEAD, serve_bad_state

MODULE = "tests.doubles.hostile_peer"  # what `LocalSwarm.start_peer(module=)` takes


def main(argv: list[str] | None = None) -> int:
    own = own_parser("hostile_peer")
    own.add_argument("--serve-bad-state", required=True, choices=sorted(AHEAD),
                     help="serve joiners noisy weights and announce a step this far ahead (far: 1000, near: 2)")
    ours, args = parse(sys.argv[1:] if argv is None else argv, own, "peer")
    return run_command(lambda: cmd_peer(args, on_stage_peer=lambda peer: serve_bad_state(peer, ours.serve_bad_state)))


if __name__ == "__main__":
    sys.exit(main())

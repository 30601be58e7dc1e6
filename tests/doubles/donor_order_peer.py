"""`swarm peer` as a joiner that asks given donors first, as a process of its own:

    python -m tests.doubles.donor_order_peer peer ARGS... --ask-first ID[,ID...]

ARGS are `swarm peer`'s. A joiner asks donors in order of announced step, then throughput
(`swarm/replicas/state_source.py`); a test that proves what the joiner does with a given donor's
state needs that donor asked whatever its announcement says at that moment (a hostile donor the
routers set aside on a loaded machine falls a step behind and announces less than the honest ones).
Of the donors the joiner found, those named go first, in the order named; the rest keep the stock
order. Every check of the stock join applies to each donor as before."""
from __future__ import annotations

import sys

from peer.replica.stage_peer import StagePeer
from swarm.cli import cmd_peer
from tests.doubles.entry import own_parser, parse, run_command

MODULE = "tests.doubles.donor_order_peer"  # what `LocalSwarm.start_peer(module=)` takes


def ask_first(peer: StagePeer, first: list[str]) -> None:
    """Make `peer`'s joins ask the donors in `first` (those it was given) before the others."""
    join = peer.join

    async def ordered(donors: list[str], timeout: float = 120.0, announced: dict[str, int] | None = None) -> str:
        named = [d for d in first if d in donors]
        return await join(named + [d for d in donors if d not in named], timeout, announced)
    peer.join = ordered


def main(argv: list[str] | None = None) -> int:
    own = own_parser("donor_order_peer")
    own.add_argument("--ask-first", required=True, help="comma-separated peer ids a join asks first, in this order")
    ours, args = parse(sys.argv[1:] if argv is None else argv, own, "peer")
    first = [p for p in ours.ask_first.split(",") if p]
    return run_command(lambda: cmd_peer(args, on_stage_peer=lambda peer: ask_first(peer, first)))


if __name__ == "__main__":
    sys.exit(main())

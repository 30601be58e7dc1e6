"""`swarm peer` as a member that takes no work, as a process of its own:

    python -m tests.doubles.idle_peer peer ARGS...

ARGS are `swarm peer`'s; the stock peer runs, except that its stage refuses every activation, so routers set it
aside and it never holds a microbatch. It still answers the leader's commands, reduces where it is seated (an empty
contribution), applies, downloads the stage's state and follows its donor: the member that costs a stage a seat
and nothing else (an attacker's "bare" id, docs/security.md), or an honest replica that routers never pick.
A test starts it with `LocalSwarm.start_peer(..., module="tests.doubles.idle_peer")`."""
from __future__ import annotations

import logging
import sys

from peer.replica.stage_peer import StagePeer
from swarm.cli import cmd_peer
from tests.doubles.entry import own_parser, parse, run_command

MODULE = "tests.doubles.idle_peer"  # what `LocalSwarm.start_peer(module=)` takes

log = logging.getLogger(__name__)


def take_no_work(peer: StagePeer) -> None:
    """Make `peer`'s stage refuse every activation (before it starts: the handler it serves is this one)."""
    daemon = peer.daemon

    async def refusing(body: bytes, sender: str) -> bytes:
        return daemon.refuse("this replica takes no work (a test double: tests/doubles/idle_peer.py).", sender)
    daemon._on_activation = refusing


def main(argv: list[str] | None = None) -> int:
    _, args = parse(sys.argv[1:] if argv is None else argv, own_parser("idle_peer"), "peer")
    return run_command(lambda: cmd_peer(args, on_stage_peer=take_no_work))


if __name__ == "__main__":
    sys.exit(main())

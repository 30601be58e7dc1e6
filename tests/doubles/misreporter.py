"""`swarm peer` as a replica that lies about the boundary messages it sent or received (issue 57), as a
process of its own:

    python -m tests.doubles.misreporter peer ARGS... --misreport a|g|r|q [--from-step N]

ARGS are `swarm peer`'s: the stock peer computes and sends honestly, and through `run_peer`'s extension
point reports other bytes (zeros) in its reduce replies for the messages of that kind (`misreport`): "a" /
"g" the activations / gradients it sent, "r" / "q" those it received (keeping the sender's real signature,
over other bytes). The leader must convict it by the senders' signatures (peer/checks/boundary_evidence.py),
whenever it joined. A test starts it with `LocalSwarm.start_peer(..., module="tests.doubles.misreporter")`."""
from __future__ import annotations

import sys

from peer.replica.stage_peer import StagePeer
from protocol.spot_check import Sent
from swarm.cli import cmd_peer
from tests.doubles.entry import own_parser, parse, run_command

MODULE = "tests.doubles.misreporter"  # what `LocalSwarm.start_peer(module=)` takes


def misreport(peer: StagePeer, kind: str, about: str | None = None, from_step: int = 0) -> None:
    """`peer` reports zeros for the digests of its messages of `kind` to or from `about` (None: any peer)
    from step index `from_step` on."""
    runner, boundary, honest_sent = peer.runner, peer.daemon.boundary, peer.daemon.boundary.sent

    def sent(step: int, attempt: int) -> list[Sent]:
        got = honest_sent(step, attempt)
        if runner.step < from_step:
            return got
        return [Sent(s.kind, s.microbatch, s.to, bytes(16), s.sig) if s.kind == kind and about in (None, s.to)
                else s for s in got]
    boundary.sent = sent


def main(argv: list[str] | None = None) -> int:
    own = own_parser("misreporter")
    own.add_argument("--misreport", required=True, choices=["a", "g", "r", "q"],
                     help="the kind of boundary message whose digests it reports falsely")
    own.add_argument("--from-step", type=int, default=0, help="honest before this step index")
    ours, args = parse(sys.argv[1:] if argv is None else argv, own, "peer")
    return run_command(lambda: cmd_peer(
        args, on_stage_peer=lambda peer: misreport(peer, ours.misreport, None, ours.from_step)))


if __name__ == "__main__":
    sys.exit(main())

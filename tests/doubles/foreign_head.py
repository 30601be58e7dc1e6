"""`swarm peer` as a head that trains on text other than the run's (what a stranger's modified head does;
the other heads must catch it: swarm/replicas/data_check.py), as a process of its own:

    python -m tests.doubles.foreign_head peer ARGS... --foreign-data PATH [--silent]

ARGS are `swarm peer`'s: the stock head reads and checks the run's text, then, through `run_peer`'s
extension point, its batch source becomes one of PATH (its driver, its share of the work and its check
of other leaders' step records all read that one source). With --silent it reports no leader's step record
to the coordinator: it only refuses to sum (issue 57: the leader's evidence of its signed refusal must do).
A test starts it with `LocalSwarm.start_peer(0, ..., module="tests.doubles.foreign_head")`."""
from __future__ import annotations

import logging
import sys

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.replica.stage_peer import StagePeer
from swarm.cli import cmd_peer
from tests.doubles.entry import own_parser, parse, run_command

MODULE = "tests.doubles.foreign_head"  # what `LocalSwarm.start_peer(module=)` takes
log = logging.getLogger(__name__)


def feed_foreign_data(peer: StagePeer, path: str) -> None:
    """A head `peer` (another stage's is left alone) reads its microbatches from the text at `path`."""
    if peer.driver is None:
        return
    source = peer.driver.batches.__self__  # the head's BatchSource, shared by all that reads its batches
    foreign = BatchSource(load_corpus(path, seq_len=source.seq_len), source.seq_len, source.microbatch_size,
                          source.seed)
    vars(source).update(vars(foreign))  # the same object, other text: every holder of its batches reads it
    log.warning("head: training on %s, not the run's text (a test double: tests/doubles)", foreign.name)


def keep_silent(peer: StagePeer) -> None:
    """A head `peer` refuses what its check refuses but tells the coordinator nothing."""
    check = peer.commit.check_record
    if check is not None:
        async def nothing(record: bytes) -> None:
            return None
        check.report = nothing


def main(argv: list[str] | None = None) -> int:
    own = own_parser("foreign_head")
    own.add_argument("--foreign-data", required=True, metavar="PATH", help="the text this head trains on")
    own.add_argument("--silent", action="store_true", help="report no leader's step record to the coordinator")

    def hook(peer: StagePeer) -> None:
        feed_foreign_data(peer, ours.foreign_data)
        if ours.silent:
            keep_silent(peer)
    ours, args = parse(sys.argv[1:] if argv is None else argv, own, "peer")
    return run_command(lambda: cmd_peer(args, on_stage_peer=hook))


if __name__ == "__main__":
    sys.exit(main())

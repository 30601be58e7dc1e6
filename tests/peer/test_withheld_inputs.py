"""A replica that withholds its inputs from its checkers, with three replicas of its stage (docs/security.md, Spot
checks): it contributes honest shares but never answers a checker's request for the inputs of its share, so every
check of it finds nothing either way. No single check convicts it (a link's hiccup is no lie): the step is re-driven
and its share checked again by a checker that has not failed to check it yet; the third check in a row that finds
nothing, by two checkers or more, convicts it. No honest peer is banned and the run equals the one-process run.
In memory and fp64, as tests/peer/test_spot_checks.py (the two-replica case is tests/peer/test_two_replica_disputes.py,
case "unreachable")."""
from __future__ import annotations

import pytest

from peer.daemon.interfaces import LinkError
from peer.replica.memory_swarm import TEST_COMMIT_OPTIONS, TEST_DRIVER_OPTIONS
from tests.peer.swarm_in_memory import make_swarm, param_hash
from tests.peer.test_spot_checks import LIES_FROM, STEPS, drive, spec_for

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

WITHHOLDER = "s1r1"


def withhold_inputs(peer, asked: list[str]) -> None:
    """From step LIES_FROM on, `peer` fails every request for the inputs of its share (as a replica that drops
    them would: the checker's request raises, and it cannot say the share is false or true)."""
    serve, runner = peer.commit.share_check.serve, peer.runner

    def withheld(req):
        if runner.step < LIES_FROM:
            return serve(req)
        asked.append(req.step)
        raise LinkError("the stream was reset.")
    peer.commit.share_check.serve = withheld


async def test_a_replica_that_withholds_its_inputs_is_convicted_at_the_third_check_in_a_row(oracle_runs):
    spec = spec_for(2)
    swarm = await make_swarm(spec, [1, 3], driver_options=dict(TEST_DRIVER_OPTIONS, spot_check_rate=1.0),
                             commit_options=dict(TEST_COMMIT_OPTIONS, straggle_after=1.0))
    asked: list[int] = []
    withhold_inputs(swarm.peers[WITHHOLDER], asked)
    banned = []
    for p in swarm.peers.values():
        ban = p.directory.ban
        p.directory.ban = lambda who, why="", ban=ban, name=p.peer_id: (banned.append((name, who)), ban(who))
    spot = swarm.peers["s0r0"].driver.spot
    logs = await drive(swarm)
    print("steps (s):", [round(log.seconds, 2) for log in logs])
    assert spot.convicted == [WITHHOLDER], spot.convicted
    assert "could not be checked 3 times in a row" in spot.reasons[WITHHOLDER], spot.reasons
    # three checks of its share found nothing, all in the step it began to withhold in, the third convicting it: at
    # least three failed attempts (4 here when no attempt fails for anything else), then the step applies without it
    assert asked == [LIES_FROM] * 3, asked
    assert logs[LIES_FROM].attempts >= 4, [log.attempts for log in logs]
    assert {who for _, who in banned} == {WITHHOLDER}, banned  # no honest peer banned, by anyone
    want = oracle_runs.losses(spec, STEPS)
    for step, (log, w) in enumerate(zip(logs, want), start=1):
        assert abs(log.loss - w) <= 1e-10 * abs(w), f"step {step}: {log.loss!r} vs the oracle's {w!r}"
    honest = [p for n, p in swarm.peers.items() if p.runner.stage == 1 and n != WITHHOLDER]
    assert len({param_hash(p.runner) for p in honest}) == 1

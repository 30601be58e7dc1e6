"""The leading head names why one step keeps failing (issue 56, item 4: no step re-driven forever without a
word): after 3 failed attempts, one line that names the peer the failures name (a refusal the head saw itself),
its stage and whether the stage has another live replica, and the head reports that peer to its directory, so
that routers avoid it. Units of `RedriveCause`, then an in-memory swarm whose only stage-1 replica refuses the
step's activations four attempts in a row (as a replica behind the swarm does) and then catches up."""
from __future__ import annotations

import asyncio
import logging

import pytest

from peer.replica.memory_swarm import TEST_COMMIT_OPTIONS
from peer.step.redrive_cause import Failure, RedriveCause, describe
from protocol.wire import KIND_ACTIVATION, ErrorReply, encode_message
from tests.peer.swarm_in_memory import make_swarm
from tests.peer.test_snapshots import spec3, until

pytestmark = pytest.mark.idle_clock  # the swarms' waits for a refuser's probes and back-offs: tests/idle_clock.py

NOT_NOW = "the message is not for the step in progress here"


def test_the_cause_is_named_every_third_failure_and_only_a_peer_most_failures_name_is_the_culprit():
    cause = RedriveCause(after=3)
    assert cause.note(4, Failure(0, NOT_NOW, "peerAAAAAAAA")) is None
    assert cause.note(4, Failure(1, "not every gradient came back within 2 s")) is None
    found = cause.note(4, Failure(2, NOT_NOW, "peerAAAAAAAA"))
    assert found is not None and (found.step, found.failures, found.culprit, found.named) == (5, 3, "peerAAAAAAAA", 2)
    assert found.reasons == [NOT_NOW]
    line = describe(found, stage=1, others=1)
    assert "step 5 failed 3 attempts, 2 of them because of peer AAAAAAAA of stage 1" in line
    assert "routing around it (1 other live replica of stage 1)" in line
    assert "only live replica" in describe(found, stage=1, others=0)
    # a new step starts afresh; failures naming different peers each, or none, name no culprit
    assert cause.note(5, Failure(0, "x", "p1")) is None and cause.note(5, Failure(1, "y", "p2")) is None
    mixed = cause.note(5, Failure(2, "z"))
    assert mixed is not None and mixed.culprit is None and "name no single peer" in describe(mixed, None, 0)
    assert cause.note(5, Failure(3, "x", "p1")) is None  # said again only every third failure


async def test_a_replica_that_keeps_refusing_the_steps_activations_is_named_after_three_attempts(oracle_runs, caplog):
    spec, steps = spec3(), 5
    swarm = await make_swarm(spec, [1, 1, 1])
    refused = {"left": 4}
    honest = swarm.net.handlers[("s1r0", KIND_ACTIVATION)]

    async def behind(body: bytes, sender: str) -> bytes:  # step 3's activations, four attempts long
        if swarm.peers["s1r0"].runner.step == 2 and refused["left"] > 0:
            return encode_message(ErrorReply(NOT_NOW))
        return await honest(body, sender)
    swarm.net.handlers[("s1r0", KIND_ACTIVATION)] = behind
    head = swarm.peers["s0r0"]
    reported: list[str] = []
    report = head.directory.report_failure
    head.directory.report_failure = lambda peer, bad_data=False: (reported.append(peer), report(peer, bad_data))
    failures = {"n": 0}
    count_failure = head.driver._name_the_cause

    async def counted(step, attempt, e):  # each failed attempt uses one refusal up: four failures in all
        failures["n"] += 1
        refused["left"] -= 1
        await count_failure(step, attempt, e)
    head.driver._name_the_cause = counted
    try:
        with caplog.at_level(logging.WARNING, logger="peer.step.driver"):
            logs = await asyncio.wait_for(swarm.drive(steps), 300)
            await swarm.applied()
    finally:
        await swarm.stop()
    assert failures["n"] == 4
    named = [r.getMessage() for r in caplog.records if "failed 3 attempts" in r.getMessage()]
    assert len(named) == 1, named
    assert "3 of them because of peer s1r0 of stage 1" in named[0] and "only live replica" in named[0], named[0]
    assert NOT_NOW in named[0]
    assert reported.count("s1r0") == 1  # routers avoid it from then on (the real Router: swarm/replicas/router.py)
    final = {log.step: log.loss for log in logs}
    want = oracle_runs.losses(spec, steps)
    assert sorted(final) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        assert abs(final[step] - want[step - 1]) <= 1e-10 * abs(want[step - 1])


async def test_a_head_that_refuses_the_leader_without_reporting_it_is_routed_around_and_the_swarm_goes_on(
        oracle_runs, caplog):
    """Three heads, one of which (s0r1) refuses every reduce of the honest leader from step 3 on ("the leader's
    step record does not match this head's data") and reports nothing, so no coordinator can judge it. Before,
    step 3 was re-driven for ever (seen: 15 attempts in 160 s, one of the issue's two open cases). The leader
    heard s0r1 refuse, names it after 3 attempts and reports it to its router, which avoids it (as the real
    Router does: `report_failure` bans it for a while, doubling); the two other heads go on, and the run equals
    the one-process run."""
    spec, steps = spec3(), 5
    # the other heads give up on s0r1's contribution when its probe says "idle" for 5 s (it took no reduce command);
    # with the tests' 5 s reduce deadline a loaded machine could call it a withholder first (seen at load 19 on 2
    # cores), and the leader's conviction ban it before it is named: a later deadline keeps the test on its path
    swarm = await make_swarm(spec, [3, 1, 1], commit_options=dict(TEST_COMMIT_OPTIONS, reduce_timeout=60.0))
    head = swarm.peers["s0r0"]

    async def refuse(cmd):
        return "the leader's step record does not match this head's data" if cmd.step >= 2 else None
    swarm.peers["s0r1"].commit.check_record = refuse
    avoided: list[str] = []

    def report_failure(peer: str, bad_data: bool = False) -> None:  # the Router's avoidance, in the loopback
        avoided.append(peer)
        head.directory.banned.add(peer)
    head.directory.report_failure = report_failure
    try:
        with caplog.at_level(logging.WARNING, logger="peer.step.driver"):
            drive = asyncio.create_task(swarm.drive(steps))
            # the refuser, left behind, stands by for ever (a real one downloads the state: own_state.py)
            await until(lambda: len({log.step for log in swarm.logs}) == steps or drive.done(), 120,
                        "the leader and the third head finish the run")
            swarm.kill("s0r1")
            logs = await asyncio.wait_for(drive, 60)
            await swarm.applied()
    finally:
        await swarm.stop()
    named = [r.getMessage() for r in caplog.records if "failed 3 attempts" in r.getMessage()]
    assert len(named) == 1 and "because of peer s0r1 of stage 0" in named[0], named
    assert "routing around it (2 other live replicas of stage 0)" in named[0], named[0]
    assert avoided == ["s0r1"]
    assert max(log.attempts for log in logs) <= 4  # three failed attempts, then the one without it
    final = {log.step: log.loss for log in logs}
    want = oracle_runs.losses(spec, steps)
    assert sorted(final) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        assert abs(final[step] - want[step - 1]) <= 1e-10 * abs(want[step - 1])

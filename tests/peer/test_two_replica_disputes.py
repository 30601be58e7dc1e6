"""Two replicas that disagree (issue 57, item 2), in memory and in fp64: nobody is banned by join order.

The liar is the FIRST replica of its stage (before, "the later to join is banned" had it get the honest
newcomer banned). A mismatch between the only two replicas of a stage bans nobody: the step is not
applied, the stage is disputed and waits; a third replica joins (what placement does in a real swarm),
two of three settle it, the liar is banned, no honest peer is, and the run equals the one-process
oracle to 1e-10. Four ways: the liar lies in its share (the honest one says so), it says the honest
replica's share is false, it says the honest replica withholds its inputs (a claim that proves
nothing: nobody is banned for it, and the third replica's check lets the step through), or it says the
honest replica's contribution never reached it (before, one blame of two convicted the blamed one: the
honest newcomer; now the step is re-driven, then disputed, and the third replica's reduce carries it).
"""
from __future__ import annotations

import asyncio
import time

import pytest

from peer.replica.memory_swarm import TEST_COMMIT_OPTIONS, TEST_DRIVER_OPTIONS
from protocol.spot_check import decode_order
from tests.peer.swarm_in_memory import make_swarm, param_hash
from tests.peer.test_spot_checks import LIES_FROM, STEPS, make_liar, spec_for

pytestmark = pytest.mark.idle_clock  # waits for deadlines, probes and back-offs: tests/idle_clock.py

LIAR, HONEST, THIRD = "s1r0", "s1r1", "s1r2"  # the liar joined stage 1 first


def false_accuser(peer, unreachable: bool = False) -> None:
    """`peer` works honestly but, from step LIES_FROM on, says every share it is told to check is false (or,
    `unreachable`, that its replica did not answer: no verdict, which a withholding replica would cause)."""
    check, runner = peer.commit.share_check.check, peer.runner

    async def lying_check(cmd, held):
        outcome = await check(cmd, held)
        if runner.step < LIES_FROM or outcome[0] != "ok":
            return outcome
        target = decode_order(cmd.check, runner.spec.n_microbatches).target
        if unreachable:
            return "failed", f"replica {target[-8:]} could not be asked for the inputs of its share (timeout).", []
        return "failed", f"replica {target[-8:]}'s contribution differs from its recomputed share by 51.", [target]
    peer.commit.share_check.check = lying_check


def false_blamer(peer) -> None:
    """`peer` works and sends honestly but, from step LIES_FROM on, says its other replicas' contributions never
    reached it (in its reduce reply's blame): what a withholding replica's victim says, said of an honest one."""
    exchange, runner = peer.commit.exchange, peer.runner
    real = exchange.exchange

    async def lying_exchange(step, attempt, mine, peers, everyone=False):
        got = await real(step, attempt, mine, peers, everyone)
        others = [p for p in peers if p != peer.daemon.peer_id]
        if runner.step < LIES_FROM or not others:
            return got
        exchange.blame = {(step, attempt): others[:1]}
        return f"replica {others[0][-8:]} ended its reduce without its contribution reaching this replica."
    exchange.exchange = lying_exchange


async def until(cond, what: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)  # poll the swarm's progress


@pytest.mark.parametrize("lie", ["share", "accusation", "unreachable", "blame"])
async def test_two_replicas_that_disagree_wait_for_a_third_which_settles_it_against_the_first_to_join(
        lie, oracle_runs):
    spec = spec_for(2)
    swarm = await make_swarm(spec, [1, 2], driver_options=dict(TEST_DRIVER_OPTIONS, spot_check_rate=1.0),
                             commit_options=dict(TEST_COMMIT_OPTIONS, straggle_after=1.0))
    if lie == "share":
        make_liar(swarm.peers[LIAR], "x-50")
    elif lie == "blame":
        false_blamer(swarm.peers[LIAR])
    else:
        false_accuser(swarm.peers[LIAR], unreachable=lie == "unreachable")
    spot = swarm.peers["s0r0"].driver.spot
    run = asyncio.ensure_future(swarm.drive(STEPS))
    try:
        # the dispute: the step that the liar lies in is re-driven, never applied, and nobody is banned
        await until(lambda: spot.disputed_stages(LIES_FROM) == [1], "the dispute")
        await asyncio.sleep(0)  # let a retry in flight reach its checks
        assert len(swarm.logs) == LIES_FROM and spot.convicted == [], (swarm.logs, spot.convicted)
        assert not any(p.directory.banned for p in swarm.peers.values())
        # a third replica joins (placement's part in a real swarm) from the honest one, and two of three settle it
        third = await swarm.add(1, THIRD, announce="syncing")
        await third.join([HONEST])
        await third.announce("online")
        logs = await asyncio.wait_for(run, 300)
        await swarm.applied()
    finally:
        if not run.done():
            run.cancel()
        await swarm.stop()
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    want = oracle_runs.losses(spec, STEPS)
    for step, (log, w) in enumerate(zip(logs, want), start=1):
        assert abs(log.loss - w) <= 1e-10 * abs(w), f"{lie}: step {step}: {log.loss!r} vs the oracle's {w!r}"
    # a claim that another replica withheld its inputs proves nothing: the third checks the share, nobody is banned
    # nor does one replica's word that another's contribution never came: with three, the step applies without the
    # one that said so (the others summed every contribution), and nobody is banned
    assert spot.convicted == ([] if lie in ("unreachable", "blame") else [LIAR]), spot.convicted
    assert logs[LIES_FROM].attempts > 1
    assert not [p for p in swarm.peers.values() if set(p.directory.banned) - {LIAR}], "an honest peer was banned"
    assert spot.disputed_stages(LIES_FROM) == [1]  # the step was disputed before the third settled it
    assert param_hash(swarm.peers[HONEST].runner) == param_hash(swarm.peers[THIRD].runner)

"""Issue 56, item 4's 3 x 2 case, in memory and fp64: three stages of two replicas, and a hostile stage-1 replica
that takes part in every reduce but never sends its contribution, then leaves. Seen at the issue's filing: the
honest stage-1 replica had fallen behind, the only up-to-date one was gone, and step 76 was re-driven 60 times in
300 s ("the message is not for the step in progress here") until `swarm local` gave up. Now no step is applied
without the honest replica (two replicas that disagree leave the stage disputed: it waits, nobody is banned), so
when the withholder leaves the honest replica is level and the swarm goes on: every step once in the end, equal
to the one-process run."""
from __future__ import annotations

import asyncio

import pytest

from peer.replica.memory_swarm import TEST_COMMIT_OPTIONS, TEST_DRIVER_OPTIONS
from tests.peer.swarm_in_memory import make_swarm, param_hash
from tests.peer.test_spot_checks import make_liar, spec_for

STEPS = 6


@pytest.mark.e2e  # in memory, but a scenario run: a dispute's reduce timeouts, every share checked (~40 s idle)
async def test_a_withholding_replica_that_then_leaves_stalls_nothing_and_the_run_equals_the_oracle(oracle_runs):
    spec = spec_for(3)
    swarm = await make_swarm(spec, [2, 2, 2], driver_options=dict(TEST_DRIVER_OPTIONS, spot_check_rate=1.0),
                             commit_options=dict(TEST_COMMIT_OPTIONS, straggle_after=1.0))
    make_liar(swarm.peers["s1r1"], "withheld")
    banned = []
    for p in swarm.peers.values():
        ban = p.directory.ban
        p.directory.ban = lambda who, why="", ban=ban: (banned.append(who), ban(who))

    head = swarm.peers["s0r0"]

    async def leave_once_disputed() -> None:  # two replicas cannot settle who lies: the stage waits; then it leaves
        while not head.driver.spot.disputed:
            await asyncio.sleep(0.05)  # poll the leader's view
        swarm.kill("s1r1")
    leaving = asyncio.create_task(leave_once_disputed())
    try:
        logs = await asyncio.wait_for(swarm.drive(STEPS), 240)
        await swarm.applied()
    finally:
        leaving.cancel()
        await swarm.stop()
    assert "s1r1" in swarm.net.down, "the stage was never disputed"
    assert set(banned) <= {"s1r1"}, banned  # no honest peer banned
    final = {log.step: log.loss for log in logs}
    assert sorted(final) == list(range(1, STEPS + 1))
    want = oracle_runs.losses(spec, STEPS)
    for step in range(1, STEPS + 1):
        assert abs(final[step] - want[step - 1]) <= 1e-10 * abs(want[step - 1]), f"step {step}"
    assert max(log.attempts for log in logs) <= 4, [log.attempts for log in logs]  # no step re-driven for long
    for s in range(3):  # the honest replicas of each stage end bit-identical, at the last step
        honest = [p for n, p in swarm.peers.items() if p.runner.stage == s and n != "s1r1"]
        assert {p.runner.step for p in honest} == {STEPS} and len({param_hash(p.runner) for p in honest}) == 1

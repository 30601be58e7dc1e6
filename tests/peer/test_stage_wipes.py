"""Issue 56, item 4: every replica of one stage killed at a random moment, 20 times in one run (in memory, fp64).
Each time a newcomer restores the stage from the snapshots other stages keep (or, before the second snapshot
step, from step 0's state when the first had not reached a custodian), the swarm rolls back to that step and
goes on; in the end every step's final loss and every stage's weights equal the one-process run.
A rollback never loops: each wipe costs at most the steps since the snapshot before it."""
from __future__ import annotations

import asyncio
import random

import pytest
import torch

from peer.replica.memory_swarm import TEST_DRIVER_OPTIONS
from tests.peer.swarm_in_memory import make_swarm
from tests.peer.test_snapshots import spec3, until

WIPES, EVERY = 20, 2
STEPS = 2 * WIPES + 4  # room for 20 wipes, each after at least one new step
# a dead replica is asked to apply for 2 s at most, and a microbatch it held is given up after 1 s
DRIVER = dict(TEST_DRIVER_OPTIONS, command_timeout=2.0, min_timeout=1.0)


@pytest.mark.e2e  # in memory, but a stress run: 20 restores and rollbacks over 44 steps (~1 min on 2 cores)
async def test_twenty_wipes_of_a_whole_stage_at_random_moments_each_roll_back_and_the_run_equals_the_oracle(
        oracle_runs):
    spec, rng = spec3(), random.Random(56)
    swarm = await make_swarm(spec, [1, 2, 1], snapshot_options=dict(every=EVERY), driver_options=DRIVER)
    head = swarm.peers["s0r0"]
    drive = asyncio.create_task(swarm.drive(STEPS))
    wiped: list[tuple[int, list[str]]] = []  # (steps done when wiped, the names killed)
    try:
        high = 0  # the furthest step the swarm had reached at the last wipe: each wipe comes after new progress
        for n in range(WIPES):
            await until(lambda high=high: max((log.step for log in swarm.logs), default=0) > high or drive.done(), 120,
                        f"a step past step {high} after wipe {n}")
            high = max(log.step for log in swarm.logs)
            assert not drive.done(), f"the run ended before wipe {n}: {drive}"
            await asyncio.sleep(rng.uniform(0.0, 0.3))  # a random moment: between steps or inside one
            victims = [p.peer_id for p in swarm.stage(1)]
            for name in victims:
                swarm.kill(name)
            wiped.append((len(swarm.logs), victims))
            await until(lambda: head.driver.paused == [1] or drive.done(), 60, f"the swarm pauses for wipe {n}")
            newcomer = await swarm.add(1, f"s1w{n}", announce="syncing")
            await asyncio.wait_for(newcomer.restore(), 60)
            await newcomer.announce("online")
        logs = await asyncio.wait_for(drive, 600)
        await swarm.applied()
    finally:
        for t in (drive, *getattr(swarm, "tasks", {}).values()):
            t.cancel()
        await asyncio.gather(drive, return_exceptions=True)
        await swarm.stop()

    final = {log.step: log.loss for log in logs}
    assert sorted(final) == list(range(1, STEPS + 1))
    want = oracle_runs.losses(spec, STEPS)
    for step in range(1, STEPS + 1):
        assert abs(final[step] - want[step - 1]) <= 1e-10 * abs(want[step - 1]), f"step {step} after {wiped}"
    # each wipe re-drove at most the steps since the snapshot before the newest (which may not have reached a
    # custodian when the stage went), plus the step it interrupted
    assert len(logs) - STEPS <= WIPES * (2 * EVERY + 1), f"{len(logs) - STEPS} steps driven again for {WIPES} wipes"
    # at most one rollback per wipe, none looping (a stage restored at the swarm's own step needs none). The lower
    # bound was WIPES // 2, the mean itself: with a snapshot every 2 steps about half the wipes need no rollback, and
    # 8, 9, 9 and 11 were seen on an idle machine (2026-12-07); the losses and the re-driven steps above are the check
    assert 1 <= head.rollback.rollbacks <= WIPES, head.rollback.rollbacks
    weights = oracle_runs.weights(spec, STEPS)
    for stage, name in enumerate(("s0r0", f"s1w{WIPES - 1}", "s2r0")):
        runner = swarm.peers[name].runner
        assert runner.step == STEPS
        for (pname, p), q in zip(runner.module.named_parameters(), weights[stage]):
            assert torch.allclose(p, q, rtol=1e-10, atol=1e-12), f"stage {stage} {pname} differs from the oracle"

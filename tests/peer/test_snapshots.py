"""A stage whose only replica dies is restored from a snapshot that peers of other stages keep;
the swarm rolls back to that step and drives the lost steps again, and the run still equals the
one-process run (in memory, fp64). Before the first snapshot, the stage's initial state is step 0's
snapshot; with no snapshot anywhere later the swarm stays paused."""
from __future__ import annotations

import asyncio
import time

import pytest
import torch

from peer.replica.memory_swarm import TEST_DRIVER_OPTIONS
from peer.state.snapshot_store import Snapshot, sha256_hex
from peer.state.snapshots import NoSnapshot
from protocol.snapshot_wire import SnapshotRequest, encode_snapshot_request
from protocol.spec import preset
from protocol.wire import KIND_SNAPSHOT
from tests.peer.swarm_in_memory import make_swarm
from tests.peer.test_replicas import SMALLER

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

STEPS, KILL_AT = 8, 5
# the head stops asking a dead replica to apply a step after 10 s (a test's failures cost seconds)
DRIVER = dict(TEST_DRIVER_OPTIONS, command_timeout=10.0)


def spec3():  # tiny narrowed as in test_replicas (SMALLER): what is restored equals the oracle at any size
    return preset("tiny", stages=3, codec="subspace", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3, **SMALLER)


async def until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.01)  # poll the swarm's progress


def kill_at(swarm, step: int, victim: str):
    def on_step(log) -> None:
        if log.step == step and victim not in swarm.net.down:
            swarm.kill(victim)  # right after the head finished `step`: the others may not have applied it
    return on_step


async def drive_and_replace_stage_1(swarm, kill: int) -> tuple[list, int]:
    """Drive the swarm, stage 1's only replica killed after step `kill`; once the swarm pauses for it, a
    newcomer "s1new" restores stage 1. Returns the step logs and the step it restored."""
    head = swarm.peers["s0r0"]

    async def replace() -> int:
        await until(lambda: head.driver.paused == [1], 60, "the swarm pauses for stage 1")
        newcomer = await swarm.add(1, "s1new", announce="syncing")
        restored_at = await newcomer.restore()
        await newcomer.announce("online")
        return restored_at

    task = asyncio.create_task(replace())
    drive = asyncio.create_task(swarm.drive(STEPS, kill_at(swarm, kill, "s1r0")))
    try:
        # a restore that fails leaves the swarm paused: the test fails then, not when the drive's 300 s are up
        await asyncio.wait({task, drive}, timeout=300, return_when=asyncio.FIRST_EXCEPTION)
        restored_at = task.result() if task.done() else await asyncio.wait_for(task, 1.0)
        logs = await asyncio.wait_for(drive, 300)
        await swarm.applied()
    finally:
        for t in (task, drive, *getattr(swarm, "tasks", {}).values()):
            t.cancel()
        await asyncio.gather(task, drive, return_exceptions=True)
        await swarm.stop()
    return logs, restored_at


def assert_every_step_and_stage_equals_the_oracle(swarm, logs: list, spec, oracle_runs) -> None:
    """The final log of every step, and every stage's parameters, equal a replica-free one-process run's."""
    final = {log.step: log.loss for log in logs}
    assert sorted(final) == list(range(1, STEPS + 1))
    want = oracle_runs.losses(spec, STEPS)
    for step in range(1, STEPS + 1):
        a, b = final[step], want[step - 1]
        assert abs(a - b) <= 1e-10 * abs(b), f"step {step}: swarm {a!r} vs oracle {b!r}"
    weights = oracle_runs.weights(spec, STEPS)
    for stage, name in enumerate(("s0r0", "s1new", "s2r0")):
        runner = swarm.peers[name].runner
        assert runner.step == STEPS
        for (pname, p), q in zip(runner.module.named_parameters(), weights[stage]):
            assert torch.allclose(p, q, rtol=1e-10, atol=1e-12), f"stage {stage} {pname} differs from the oracle"


async def test_a_stage_whose_only_replica_died_is_restored_and_the_swarm_re_drives_to_the_oracle(oracle_runs):
    spec = spec3()
    swarm = await make_swarm(spec, [1, 1, 1], snapshot_options=dict(every=2), driver_options=DRIVER)
    logs, restored_at = await drive_and_replace_stage_1(swarm, KILL_AT)
    assert "s1r0" in swarm.net.down
    # stage 1's snapshots were kept by the peers of both other stages
    assert all(swarm.peers[p].snapshots.store.listed(1) for p in ("s0r0", "s2r0"))
    assert restored_at in (2, 4), f"restored from step {restored_at}"
    # the steps after the snapshot were driven twice, the final logs of every step equal the oracle
    numbers = [log.step for log in logs]
    assert numbers.count(restored_at + 1) == 2 and numbers.count(KILL_AT) == 2, numbers
    assert all(swarm.peers[p].rollback.rollbacks == 1 for p in ("s0r0", "s1new", "s2r0"))
    assert_every_step_and_stage_equals_the_oracle(swarm, logs, spec, oracle_runs)  # the restored stage's included


async def test_when_the_only_head_dies_a_new_head_restores_stage_0_and_rolls_the_swarm_back_to_the_oracle(
        oracle_runs):
    spec = spec3()
    swarm = await make_swarm(spec, [1, 1, 1], snapshot_options=dict(every=2), driver_options=DRIVER)
    try:
        # killed right after step 6: the others applied step 5 (a step's share waits for the last
        # one's apply), the newest snapshot of stage 0 the others keep is step 4's. drive returns when
        # its only head is gone: nothing drives, the other stages wait
        await asyncio.wait_for(swarm.drive(STEPS, kill_at(swarm, 6, "s0r0")), 300)
        assert "s0r0" in swarm.net.down and len(swarm.logs) == 6
        await until(lambda: all(swarm.peers[p].snapshots.store.listed(0) for p in ("s1r0", "s2r0")), 30,
                    "the other stages keep stage 0's snapshot")
        newcomer = await swarm.add(0, "s0new", announce="syncing")
        restored_at = await newcomer.restore()
        await newcomer.announce("online")
        told = []

        async def before(target: int, step: int) -> None:  # the coordinator hears first (swarm/replicas/vouched.py)
            told.append((target, step, [swarm.peers[p].rollback.rollbacks for p in ("s1r0", "s2r0")]))
        newcomer.rollback.before = before
        # behind the others (they may hold step 5 too), the new head still leads: it rolls them back first
        await asyncio.wait_for(newcomer.drive(STEPS, swarm.logs.append), 300)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert restored_at == 4, f"restored from step {restored_at}"
    # told before any replica rolled back: the swarm's step then, and the step it goes back to
    assert len(told) == 1 and told[0][0] == 4 and told[0][1] in (5, 6) and told[0][2] == [0, 0], told
    # the new head was behind the swarm: it rolled every stage back to its step 4 before it led
    assert all(swarm.peers[p].rollback.rollbacks == 1 for p in ("s1r0", "s2r0"))
    numbers = [log.step for log in swarm.logs]
    assert numbers.count(5) == numbers.count(6) == 2, numbers  # driven by the dead head, then again
    final = {log.step: log.loss for log in swarm.logs}
    assert sorted(final) == list(range(1, STEPS + 1))
    want = oracle_runs.losses(spec, STEPS)
    for step in range(1, STEPS + 1):
        a, b = final[step], want[step - 1]
        assert abs(a - b) <= 1e-10 * abs(b), f"step {step}: swarm {a!r} vs oracle {b!r}"
    for stage, name in enumerate(("s0new", "s1r0", "s2r0")):
        assert swarm.peers[name].runner.step == STEPS, f"stage {stage} is at step {swarm.peers[name].runner.step}"


async def test_a_stage_emptied_before_the_first_snapshot_restores_step_0_and_the_swarm_re_drives_to_the_oracle(
        oracle_runs):
    """No snapshot exists before step `every`; step 0's state is the seed's, which any peer builds: the swarm rolls
    back to the run's start (losing fewer than `every` steps) rather than stay paused for good."""
    spec = spec3()
    swarm = await make_swarm(spec, [1, 1, 1], snapshot_options=dict(every=100), driver_options=DRIVER)
    logs, restored_at = await drive_and_replace_stage_1(swarm, 3)
    assert restored_at == 0 and not any(swarm.peers[p].snapshots.store.listed(1) for p in ("s0r0", "s2r0"))
    numbers = [log.step for log in logs]
    assert numbers.count(1) == numbers.count(3) == 2 and numbers.count(4) == 1, numbers  # 1-3 driven again
    assert all(swarm.peers[p].rollback.rollbacks == 1 for p in ("s0r0", "s1new", "s2r0"))
    assert_every_step_and_stage_equals_the_oracle(swarm, logs, spec, oracle_runs)


async def test_with_no_snapshot_anywhere_the_stage_is_not_started_afresh_and_the_swarm_stays_paused():
    spec = spec3()
    # past its second snapshot (step 4) the swarm has trained state to lose: stage 1 kept its snapshots itself
    # (no custodians), and they died with it (before step 4 the first snapshot may not have reached a custodian
    # yet, and the stage starts from step 0's state: test_stage_wipes.py)
    swarm = await make_swarm(spec, [1, 1, 1], snapshot_options=dict(every=2, copies=0), driver_options=DRIVER)
    head = swarm.peers["s0r0"]
    drive = asyncio.create_task(swarm.drive(STEPS, kill_at(swarm, 5, "s1r0")))
    try:
        await until(lambda: head.driver.paused == [1], 60, "the swarm pauses for stage 1")
        newcomer = await swarm.add(1, "s1new", announce="syncing")
        with pytest.raises(NoSnapshot, match="no live peer holds a usable snapshot of stage 1"):
            await newcomer.restore()
        assert newcomer.runner.step == 0  # nothing was loaded, nothing started afresh
        done = len(swarm.logs)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # an observation window: the swarm must not move in it
            assert head.driver.paused == [1] and swarm.net.status["s0r0"].state == "paused"
            assert len(swarm.logs) == done and not drive.done()
            await asyncio.sleep(0.05)
    finally:
        for t in swarm.tasks.values():
            t.cancel()
        if head.driver._applying is not None:  # its retries of step 5's apply for stage 1 (command_timeout)
            head.driver._applying.cancel()
        await asyncio.gather(drive, return_exceptions=True)
        await swarm.stop()
    assert done == 5


async def test_a_custodian_takes_an_offer_only_from_a_replica_of_the_offered_stage():
    spec = spec3()
    swarm = await make_swarm(spec, [1, 1, 1], snapshot_options=dict(every=100))
    try:
        fake = encode_snapshot_request(SnapshotRequest(spec.run_hash, "offer", 1, 2, 0, "a" * 64, 1000))
        reply = await swarm.peers["s2r0"].link.request("s0r0", KIND_SNAPSHOT, fake)
        assert b"only a live replica of stage 1" in reply
        own = encode_snapshot_request(SnapshotRequest(spec.run_hash, "offer", 0, 2, 0, "a" * 64, 1000))
        reply = await swarm.peers["s0r0"].link.request("s0r0", KIND_SNAPSHOT, own)
        assert b"keep their own snapshots" in reply
        # a replica of stage 1 that offers bytes not matching its sha256: fetched, refused, not kept
        s1 = swarm.peers["s1r0"]
        s1.snapshots.store.put(Snapshot(1, 2, sha256_hex(b"state"), b"state"))
        forged = encode_snapshot_request(SnapshotRequest(spec.run_hash, "offer", 1, 2, 0, "b" * 64, 5))
        assert await s1.link.request("s0r0", KIND_SNAPSHOT, forged) == b""  # accepted for fetching
        await until(lambda: not swarm.peers["s0r0"].snapshots._fetching, 10, "the custodian's fetch ends")
        assert swarm.peers["s0r0"].snapshots.store.listed(1) == []
    finally:
        await swarm.stop()


async def test_the_leader_learns_every_stages_snapshot_hash_and_a_restore_loads_only_a_vouched_one():
    from peer.state.state_transfer import load_state_bytes, state_bytes
    spec = spec3()
    swarm = await make_swarm(spec, [1, 1, 1], snapshot_options=dict(every=2), driver_options=DRIVER)
    head = swarm.peers["s0r0"]
    try:
        await asyncio.wait_for(swarm.drive(5), 120)
        await swarm.applied()
        # the reduce replies of step 5 told the leader each stage's snapshot at step 4: every replica agreed
        step, hashes = head.driver.last_snapshots
        assert step == 4 and sorted(hashes) == [0, 1, 2]
        for stage, name in enumerate(("s0r0", "s1r0", "s2r0")):
            assert hashes[stage] == swarm.peers[name].snapshots.store.get(stage, 4).sha256
        # both custodians of stage 1 are made to hold a poisoned, well-formed snapshot at a later step
        honest = swarm.peers["s0r0"].snapshots.store.get(1, 4)
        state = load_state_bytes(honest.data)
        state["step"] = 6
        next(iter(v for v in state["module"].values() if v.is_floating_point())).add_(1.0)
        data = state_bytes(state)
        for name in ("s0r0", "s2r0"):
            swarm.peers[name].snapshots.store.put(Snapshot(1, 6, sha256_hex(data), data))
        newcomer = await swarm.add(1, "s1new", announce="syncing")

        async def vouched() -> dict[int, str]:
            return {step: hashes[1]}
        newcomer.snapshots.vouched = vouched
        assert await newcomer.restore() == 4  # the custodians' majority said step 6; the swarm vouched for 4
        assert newcomer.snapshots.store.newest(1).sha256 == hashes[1]
        newcomer.snapshots.vouched = None  # without a vouch the custodians decide: the poisoned one
        assert await newcomer.restore() == 6
    finally:
        await swarm.stop()

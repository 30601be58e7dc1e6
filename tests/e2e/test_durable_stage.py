"""A stage that loses every replica is restored, not reset (real processes over libp2p).

Three stages, one peer each, snapshots every 5 steps. Stage 1's only peer is SIGKILLed mid-run:
the swarm pauses and stays paused; 30 s later a fresh peer takes stage 1, restores it from the
snapshot that the peers of the other stages keep, every stage rolls back to that step, the lost
steps are driven again, and the run still equals the one-process run. Nothing is started from
initial weights, and nothing of the killed peer is left running."""
from __future__ import annotations

import asyncio
import math
import time

from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from tests.e2e.conftest import wait_for_event, wait_for_steps
from tests.e2e.processes import sigkill_and_wait_for_group
from tests.peer.swarm_in_memory import oracle

STEPS, EVERY, KILL_AFTER, JOIN_AFTER_S = 24, 5, 12, 30.0


def _log(swarm: LocalSwarm, name: str) -> str:
    path = swarm.dir / f"{name}.log"
    return path.read_text() if path.exists() else ""


def _records(swarm: LocalSwarm) -> list[dict]:
    return [e for e in swarm.events("stage0") if e["event"] == "step"]


async def test_a_stage_that_lost_every_replica_pauses_the_swarm_then_is_restored_from_a_snapshot(tmp_path):
    spec = preset("tiny", stages=3, batch_size=32, microbatch_size=8, lr=1e-3)
    swarm = LocalSwarm(LocalOptions(spec, steps=STEPS, workdir=str(tmp_path / "durable"), threads=1, quiet=True,
                                    extra_peer_args=["--ttl", "6"]))
    try:
        await asyncio.to_thread(swarm.start_coordinator, "--snapshot-every", str(EVERY), serving=False)
        swarm.start_peer(1)
        swarm.start_peer(2)
        # a head on a 20 Mbit/s uplink: the run is still under way when stage 1 is killed
        swarm.start_peer(0, "--steps", str(STEPS), "--bandwidth", "20mbit")
        await asyncio.to_thread(wait_for_steps, swarm, KILL_AFTER, 180)
        # the scenario is a stage restored from what the other stages keep: stage 1 dies once a copy of its
        # snapshot is kept elsewhere (a fast run can reach step 12 while the first copy is still on its way;
        # killed then, nothing of stage 1 survives and the swarm stays paused, as it must)
        deadline = time.monotonic() + 60
        while not any("keeping stage 1's snapshot" in _log(swarm, n) for n in ("stage0", "stage2")):
            assert time.monotonic() < deadline, "no peer kept stage 1's snapshot:\n" + _log(swarm, "stage0")[-3000:]
            await asyncio.sleep(0.2)  # poll the custodians' logs
        victim = dict(swarm.procs)["stage1"]
        await asyncio.to_thread(sigkill_and_wait_for_group, victim)  # its DHT child and p2pd go with it
        t_kill = time.monotonic()
        swarm.procs = [(n, p) for n, p in swarm.procs if n != "stage1"]
        killed_at = len(_records(swarm))

        # paused, and it stays paused: no step is recorded while stage 1 has no peer
        deadline = t_kill + 60
        while "paused: stage 1 has no live peer" not in _log(swarm, "stage0"):
            assert time.monotonic() < deadline, "the head never paused for stage 1:\n" + _log(swarm, "stage0")[-3000:]
            await asyncio.sleep(0.2)  # poll the head's log
        paused_at = len(_records(swarm))
        # the oracle trains while the swarm is paused (one torch thread; the swarm waits, it does not compute)
        want = asyncio.create_task(asyncio.to_thread(oracle, spec, STEPS))
        while time.monotonic() < t_kill + JOIN_AFTER_S:  # the observation window the issue asks for
            assert len(_records(swarm)) == paused_at, "a step was recorded while stage 1 had no live peer"
            swarm._check_alive()
            await asyncio.sleep(0.5)

        swarm.start_peer(1, name="newcomer")
        restored = (await asyncio.to_thread(wait_for_event, swarm, "newcomer", "restored", 120))[0]
        records = await asyncio.to_thread(swarm.follow, 120.0)
        await asyncio.to_thread(swarm.wait_for_head)
    finally:
        await asyncio.to_thread(swarm.stop)
    oracle_losses = await want

    assert killed_at < STEPS, "the run was over before the kill: nothing was tested"
    # restored from a snapshot taken before the kill, behind the step the swarm had reached
    assert restored["step"] % EVERY == 0 and EVERY <= restored["step"] <= killed_at, restored
    assert restored["swarm_step"] >= killed_at > restored["step"], restored
    logs = {name: _log(swarm, name) for name in ("stage0", "stage2", "newcomer")}
    assert not any("initial weights" in text for text in logs.values()), "a stage was started afresh"
    assert not [e for e in swarm.events("newcomer") if e["event"] in ("fresh_stage", "joined")]
    assert f"every stage rolls back to step {restored['step']}" in logs["stage0"]
    assert f"rolled back to step {restored['step']}" in logs["stage2"]
    # the steps after the snapshot were driven twice; the ones that stand are every step once
    driven = [e["step"] for e in _records(swarm)]
    assert driven.count(restored["step"] + 1) == 2, driven
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    losses = [r["loss"] for r in records]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.3
    for step, (a, b) in enumerate(zip(losses, oracle_losses), start=1):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: swarm {a} vs oracle {b}"

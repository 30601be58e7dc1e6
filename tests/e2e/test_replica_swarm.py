"""Replicas per stage in real swarms (separate processes over libp2p): a replica of every stage
killed with SIGKILL mid-run costs retries, not steps, and leaves nothing behind; a fresh peer
joins a stage mid-run by downloading its state; peers started at once with --stage auto cover
every stage, and a stage emptied by a kill gets a peer back."""
from __future__ import annotations

import asyncio
import math
import time

import torch

from peer.runner.checkpoint import checkpoint_path, load_checkpoint
from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from tests.e2e.conftest import wait_for_event, wait_for_steps
from tests.e2e.processes import sigkill_and_wait_for_group
from tests.peer.swarm_in_memory import oracle


def _local(tmp_path, name: str, **overrides) -> LocalSwarm:
    replicas = overrides.pop("replicas", 1)
    steps = overrides.pop("steps", 20)
    spec = preset("tiny", **{"stages": 2, **overrides})
    return LocalSwarm(LocalOptions(spec, steps=steps, replicas=replicas, workdir=str(tmp_path / name), threads=1,
                                   quiet=True, extra_peer_args=["--ttl", "6"]))


async def test_killing_a_replica_of_every_stage_mid_run_loses_no_step(tmp_path):
    steps = 40  # steps left after the kills (the kills take seconds; with the shared fork server 16 could all be done
    # before them); the loss bound below holds from step 5 on
    swarm = _local(tmp_path, "kill", replicas=2, steps=steps, batch_size=32, microbatch_size=8, lr=1e-3)
    try:
        await asyncio.to_thread(swarm.start)
        names = [swarm.peer_name(s, r) for s in range(2) for r in range(2)]
        for name in names:
            wait_for_event(swarm, name, "ready")
        await asyncio.to_thread(wait_for_steps, swarm, 4)
        # the leading head (the one that drove the latest step) and one replica of stage 1, while steps are under way
        leader = max(swarm.head_names(), key=lambda n: max((e["step"] for e in swarm.events(n) if e["event"] == "step"),
                                                             default=0))
        procs = dict(swarm.procs)
        seconds = [await asyncio.to_thread(sigkill_and_wait_for_group, procs[name])
                   for name in (leader, swarm.peer_name(1, 0))]
        killed_at = len(swarm.step_events()[0])
        swarm.procs = [(n, p) for n, p in swarm.procs if n not in (leader, swarm.peer_name(1, 0))]
        # the oracle trains meanwhile (one torch thread): the swarm mostly waits for its failover now
        want = asyncio.create_task(asyncio.to_thread(oracle, swarm.opts.spec, steps))
        records = await asyncio.to_thread(swarm.follow, 90.0)  # a stuck step fails in 90 s, not 300
    finally:
        await asyncio.to_thread(swarm.stop)
    oracle_losses = await want
    assert killed_at < steps, "the run was over before the kills: nothing was tested"
    survivor = next(n for n in swarm.head_names() if n != leader)
    assert any(e["event"] == "step" and e["step"] > killed_at for e in swarm.events(survivor)), \
        "the surviving head never drove a step"
    assert all(s < 20 for s in seconds)  # the DHT child and p2pd of each killed peer went with it
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    spec = swarm.opts.spec
    assert all(r["tokens"] == spec.batch_size * spec.seq_len for r in records)
    losses = [r["loss"] for r in records]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.3
    # every microbatch was applied exactly once: the run is the single-replica oracle's, step for step
    for step, (a, b) in enumerate(zip(losses, oracle_losses), start=1):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: swarm {a} vs oracle {b}"


async def test_a_fresh_peer_joins_mid_run_and_equals_its_replica(tmp_path):
    steps = 40  # the newcomer joins within about 20 steps of its start, and takes part in the steps after
    swarm = _local(tmp_path, "join", steps=steps)
    dirs = {name: tmp_path / f"ckpt-{name}" for name in ("old", "new")}
    try:
        # no snapshot in this run: custody traffic through the head's 1 Mbit/s uplink at step 50 got a
        # healthy replica banned at its per-microbatch deadline, and a banned replica never caught up
        # (a separate problem, noted for an issue; this test is about the join)
        await asyncio.to_thread(swarm.start_coordinator, "--snapshot-every", "1000", serving=False)
        swarm.start_peer(1, "--checkpoint-dir", str(dirs["old"]), name="stage1")
        # a head on a 1 Mbit/s uplink (~0.5 s a step): the run lasts well beyond the newcomer's start
        swarm.start_peer(0, "--steps", str(steps), "--bandwidth", "1mbit", name="stage0")
        await asyncio.to_thread(wait_for_event, swarm, "stage0", "step", 120, 5)
        swarm.start_peer(1, "--checkpoint-dir", str(dirs["new"]), name="newcomer")
        joined = (await asyncio.to_thread(wait_for_event, swarm, "newcomer", "joined", 120))[0]
        await asyncio.to_thread(swarm.follow)
        await asyncio.to_thread(swarm.wait_for_head)
    finally:
        await asyncio.to_thread(swarm.stop)  # both stage-1 peers write their checkpoint at their last step
    assert 5 <= joined["step"] < steps
    old, new = (load_checkpoint(checkpoint_path(dirs[k], swarm.run_hash, 1)) for k in ("old", "new"))
    assert old["step"] == new["step"] == steps
    for name, tensor in old["module"].items():
        assert torch.equal(tensor, new["module"][name]), f"{name} differs between the replicas"
    assert any(e["event"] == "ready" for e in swarm.events("newcomer"))


async def test_simultaneous_auto_joins_cover_every_stage_and_an_emptied_stage_is_refilled(tmp_path):
    swarm = _local(tmp_path, "auto", stages=3)
    try:
        maddrs = await asyncio.to_thread(swarm.start_coordinator, serving=False)
        names = [f"p{i}" for i in range(5)]
        for name in names:  # five peers within a second, as five volunteers pressing enter at once
            swarm.start_peer("auto", "--steps", "100000", "--rebalance-period", "3", name=name)
        ready = {n: (await asyncio.to_thread(wait_for_event, swarm, n, "ready", 180))[0] for n in names}
        stages = {n: r["stage"] for n, r in ready.items()}
        assert set(stages.values()) == {0, 1, 2}, f"stages chosen: {stages}"

        alone = [s for s in (0, 1, 2) if list(stages.values()).count(s) == 1]
        victim = next(n for n, s in stages.items() if s == alone[-1])
        procs = dict(swarm.procs)
        t0 = time.monotonic()
        await asyncio.to_thread(sigkill_and_wait_for_group, procs[victim])
        swarm.procs = [(n, p) for n, p in swarm.procs if n != victim]
        deadline = time.monotonic() + 60
        while True:  # poll the reports for a peer that moved to the emptied stage and serves it
            moved = [n for n in names if n != victim and stages[n] != stages[victim] and any(
                e["event"] == "ready" and e["stage"] == stages[victim] for e in swarm.events(n))]
            if moved:
                break
            assert time.monotonic() < deadline, f"stage {stages[victim]} got no peer back within 60 s"
            await asyncio.sleep(0.2)
        assert maddrs
    finally:
        await asyncio.to_thread(swarm.stop)
    # ttl 6 s for the dead peer's record to expire, then at most a 3 s rebalance period (and a join)
    assert time.monotonic() - t0 < 60

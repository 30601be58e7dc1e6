"""A fake id that announces a far step before a swarm trains does not stop it from starting (real
processes over libp2p, a coordinator): the step the swarm is on comes from the swarm key's
records, not from announcements (swarm/replicas/swarm_step.py).

An attacker (its own hivemind node, with the run's proof of work) announces itself on stage 1 at
step 1000 before any peer starts. Before the fix the head, finding no live replica of stage 0,
took the fake's step for the swarm's and waited for a snapshot of an untrained swarm that does not
exist: the swarm never started. Now it ignores the claim (and logs it) and the swarm trains."""
from __future__ import annotations

import asyncio

from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from tests.e2e.attacker import Attacker

STEPS, FAR = 3, 1000


async def test_a_far_step_announced_before_the_swarm_trains_does_not_stall_it(tmp_path):
    spec = preset("tiny", stages=3)
    swarm = LocalSwarm(LocalOptions(spec, steps=STEPS, workdir=str(tmp_path / "run"), quiet=True, threads=1))
    try:
        maddrs = await asyncio.to_thread(swarm.start_coordinator)
        async with Attacker(maddrs) as fake:
            await fake.announce(1, step=FAR)
            for s in (1, 2):
                swarm.start_peer(s)
            swarm.start_peer(0, "--steps", str(STEPS))
            records = await asyncio.to_thread(swarm.follow, 90.0)
            await asyncio.to_thread(swarm.wait_for_head)
    finally:
        await asyncio.to_thread(swarm.stop)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    events = [e["event"] for name in ("stage0", "stage1", "stage2") for e in swarm.events(name)]
    assert "waiting_for_snapshot" not in events and "restored" not in events and "fresh_stage" not in events
    head_log = (swarm.dir / "stage0.log").read_text()
    assert f"{fake.peer_id[-8:]} (stage 1, step {FAR})" in head_log, head_log[-3000:]

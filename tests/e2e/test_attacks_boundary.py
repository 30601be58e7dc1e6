"""A replica that lies about the boundary messages it received, over real libp2p (issue 57): every
activation carries its sender's signature (swarm/trust/boundary_signer.py, the peer's libp2p identity), the
receiver reports it, and the leading head convicts a receiver whose report its sender never signed.

The liar is the FIRST replica of stage 1 (before, a sender/receiver disagreement banned "the later to join":
this liar would have got the honest replica banned). It computes and sends honestly and misreports the
digest of every activation it receives (`tests/doubles/misreporter.py`, a stock `swarm peer` with a hook).
The leader bans it at its first lie and tells it why (it stops), no honest peer is banned, and the swarm
goes on with the honest replica: the run equals the one-process oracle step for step. `swarm status` then
lists the ban (item 3), from the health records of the peers still up."""
from __future__ import annotations

import asyncio
import re
import time

from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from swarm.monitor.status import swarm_state
from tests.doubles.misreporter import MODULE
from tests.e2e.conftest import wait_for_event
from tests.peer.swarm_in_memory import oracle

STEPS = 8


async def test_a_first_replica_that_misreports_what_it_received_is_banned_by_the_senders_signature(tmp_path):
    spec = preset("tiny", stages=2, batch_size=32, microbatch_size=8, lr=1e-3)
    swarm = LocalSwarm(LocalOptions(spec, steps=STEPS, replicas=2, workdir=str(tmp_path / "sig"), threads=1,
                                    quiet=True, extra_peer_args=["--ttl", "6"]))
    try:
        await asyncio.to_thread(swarm.start_coordinator, serving=False)
        swarm.start_peer(1, "--misreport", "r", "--from-step", "1", name="liar", module=MODULE)
        await asyncio.to_thread(wait_for_event, swarm, "liar", "ready", 120)  # it joins stage 1 first
        swarm.start_peer(1, name="honest")
        await asyncio.to_thread(wait_for_event, swarm, "honest", "ready", 120)
        want = asyncio.create_task(asyncio.to_thread(oracle, spec, STEPS))
        swarm.start_peer(0, "--steps", str(STEPS), name="stage0")
        deadline = time.monotonic() + 180
        while not swarm.step_events()[1]:  # polled: the liar's process ends (banned), which `follow` takes for a crash
            assert time.monotonic() < deadline, (swarm.dir / "stage0.log").read_text()[-3000:]
            await asyncio.sleep(0.5)
        records = swarm.step_events()[0]
        await asyncio.to_thread(swarm.wait_for_head)
        # `swarm status` (its data) lists the ban, read from the health records of the peers still up
        deadline = time.monotonic() + 60
        while not (bans := (status := await swarm_state(swarm.maddrs)).get("bans")):
            assert time.monotonic() < deadline, "no peer's health record lists the ban"
            await asyncio.sleep(1.0)  # poll: a record is published every third of --ttl
    finally:
        await asyncio.to_thread(swarm.stop)
    head = (swarm.dir / "stage0.log").read_text()
    liar, honest = (swarm.dir / "liar.log").read_text(), (swarm.dir / "honest.log").read_text()
    assert "is banned for the run: it reports microbatch" in head and "never signed" in head, head[-3000:]
    banned = set(re.findall(r"(?:replica|peer) (\S+) is banned for the run", head))
    assert len(banned) == 1, f"more than the liar was banned: {banned}"
    assert [b["peer"][-8:] for b in bans] == [b[-8:] for b in banned] and bans[0]["reported_by"], bans
    assert status["coordinator"]["peer"] and 0 <= status["coordinator"]["lease_age_s"] < 120, status["coordinator"]
    assert "banned this peer for the run" in liar and "banned this peer" not in honest
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for step, (r, w) in enumerate(zip(records, await want), start=1):
        assert abs(r["loss"] - w) <= 1e-5 * abs(w), f"step {step}: swarm {r['loss']} vs oracle {w}"

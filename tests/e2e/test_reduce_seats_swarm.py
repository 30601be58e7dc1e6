"""Seats by work in a real swarm (peer/step/seats.py; separate processes over libp2p): a head that seats no member
beyond those that work (`--probation-seats 0`), one replica of stage 1 that works and two that take no work
(tests/doubles/idle_peer.py: they refuse every activation, answer every command and reduce where seated). From
the leader's second commit on the idle two are left out of the reduce; told the step's apply, each finds it holds
no sum of it, downloads the stage's state and follows its donor's sums to the last step (a replica catching up
refuses to be a donor itself: the other idle one would have waited a minute on it); the run equals the oracle."""
from __future__ import annotations

import asyncio
import re

from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from tests.doubles.idle_peer import MODULE as IDLE_PEER
from tests.e2e.conftest import follow_beside_oracle, wait_for_event

IDLE = ("idle1", "idle2")


async def test_members_that_take_no_work_are_left_out_catch_up_by_themselves_and_the_run_equals_the_oracle(tmp_path):
    steps = 24
    spec = preset("tiny", stages=2, batch_size=32, microbatch_size=8, lr=1e-3)
    swarm = LocalSwarm(LocalOptions(spec, steps=steps, replicas=1, workdir=str(tmp_path / "seats"), threads=1,
                                    quiet=True, extra_peer_args=["--ttl", "6"]))
    head = swarm.head_names()[0]
    try:
        await asyncio.to_thread(swarm.start_coordinator, serving=False)
        swarm.start_peer(1, name="worker")
        for name in IDLE:
            swarm.start_peer(1, name=name, module=IDLE_PEER)
        ids = {name: (await asyncio.to_thread(wait_for_event, swarm, name, "ready", 120))[0]["peer_id"]
               for name in ("worker", *IDLE)}
        swarm.start_peer(0, "--steps", str(steps), "--probation-seats", "0", name=head)
        records, oracle_losses = await follow_beside_oracle(swarm, spec, steps)
    finally:
        await asyncio.to_thread(swarm.stop)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    lead = (swarm.dir / f"{head}.log").read_text()
    seated = re.findall(r"stage 1 seats (\d+) of its (\d+) members in the reduce", lead)
    assert ("1", "3") in seated, f"the leader never left the idle members out: {seated}"
    for name in IDLE:
        log = (swarm.dir / f"{name}.log").read_text()
        assert "takes no work" in log, f"{name} was never given a microbatch: the test shows nothing"
        assert "it downloads the stage's state again" in log, f"{name} was left out and never caught up"
        joined = [e for e in swarm.events(name) if e["event"] == "joined"]
        assert joined and joined[-1]["donor"] == ids["worker"], (name, joined)
        # left out of every reduce since, it stayed level on its donor's forwarded sums, to the run's last step
        assert re.findall(r"leaving stage 1 at step (\d+)", log) == [str(steps)], f"{name} did not stay level"
    # every microbatch was applied exactly once: the run is the one-replica oracle's, step for step
    for step, (r, w) in enumerate(zip(records, oracle_losses), start=1):
        assert abs(r["loss"] - w) <= 1e-5 * abs(w), f"step {step}: swarm {r['loss']} vs oracle {w}"

"""A single peer per stage: the head is stopped with SIGTERM at step 10 and resumed from its
checkpoint; the steps after it equal an uninterrupted run, and a basis update published while
it was down is caught up from the DHT."""
from __future__ import annotations

import asyncio
import signal

from peer.runner.checkpoint import checkpoint_path, load_checkpoint
from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from tests.doubles import slow_coordinator
from tests.e2e.conftest import wait_for_event
from tests.e2e.test_basis_updates import Client

STEPS = 20


async def test_head_resumes_exactly_and_catches_up_a_basis_update_published_while_it_was_down(tmp_path, oracle_runs):
    # re-fits after steps 5, 10, 15 take effect at 7, 12, 17; the coordinator publishes each 4 s
    # after its statistics arrive, so the one of step 10 appears while the head is down
    spec = preset("tiny", stages=3, codec="subspace", basis_interval=5)
    ckpt = tmp_path / "ckpt"
    swarm = LocalSwarm(LocalOptions(spec, steps=STEPS, workdir=str(tmp_path / "run"), quiet=True, threads=1))
    try:
        maddrs = await asyncio.to_thread(swarm.start_coordinator, "--refit-delay", "4", module=slow_coordinator.MODULE,
                                         serving=False)
        for s in (1, 2):
            swarm.start_peer(s)
        head = swarm.start_peer(0, "--steps", str(STEPS), "--checkpoint-dir", str(ckpt), name="head")
        await asyncio.to_thread(wait_for_event, swarm, "head", "step", 180, 10)
        head.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(head.wait, 60) == 0, "the head did not stop cleanly on SIGTERM"
        swarm.procs = [(n, p) for n, p in swarm.procs if p is not head]
        # the oracle trains meanwhile (one torch thread): the swarm waits for its head now
        oracle = asyncio.create_task(asyncio.to_thread(oracle_runs.losses, spec, STEPS))
        saved = load_checkpoint(checkpoint_path(ckpt, swarm.run_hash, 0))
        async with Client(maddrs) as c:
            published = await c.wait_for_version(2)  # appears while the head is down
        assert saved["basis_version"] == 1 and saved["scheduled"] is None, \
            "the head had the update before it stopped: this test would prove nothing; raise --refit-delay"
        assert published.effective_step == 12 and saved["step"] in (10, 11)

        swarm.start_peer(0, "--steps", str(STEPS), "--checkpoint-dir", str(ckpt), "--resume", name="head2")
        resumed = await asyncio.to_thread(wait_for_event, swarm, "head2", "step", 240, STEPS - saved["step"])
    finally:
        await asyncio.to_thread(swarm.stop)

    losses, log = await oracle, oracle_runs.basis_log(spec, STEPS)
    assert [r["step"] for r in resumed] == list(range(saved["step"] + 1, STEPS + 1))
    for rec in resumed:
        want = losses[rec["step"] - 1]
        assert abs(rec["loss"] - want) <= 1e-5 * abs(want), f"step {rec['step']}: {rec['loss']} vs oracle {want}"
        assert rec["basis_version"] == sum(1 for _, eff in log if eff <= rec["step"] - 1)
    assert any(rec["basis_version"] == 2 for rec in resumed)  # the caught-up update took effect

"""A caught liar's steps are rolled back (issue 20, item 2), in memory, fp64: a head that holds the
lease feeds other data for some steps; the swarm key's next lease revokes it and orders a rollback
to the snapshot before it led; the next leader carries it out, the steps are driven again on the
run's data, and every stage's weights then equal a clean run's (the run's data only) within 1e-10.
With no snapshot of the ordered step held anywhere, the head says so loudly and the swarm goes on."""
from __future__ import annotations

import asyncio
import logging
import random
import re

import pytest
import torch

from peer.daemon.interfaces import RollbackOrder
from peer.replica.memory_swarm import TEST_DRIVER_OPTIONS
from protocol.spec import preset
from tests.peer.swarm_in_memory import batches, make_swarm
from tests.peer.test_replicas import SMALLER

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

STEPS, LIAR_FROM, CAUGHT = 10, 4, 7  # the liar drives steps 5-7 (after the snapshot at 4)
DRIVER = dict(TEST_DRIVER_OPTIONS, command_timeout=10.0)


def spec3():  # tiny narrowed as in test_replicas (SMALLER): what is restored equals the oracle at any size
    return preset("tiny", stages=3, codec="subspace", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3, **SMALLER)


async def liar_swarm(spec, tmp_path, order: RollbackOrder, fresh_head: bool = False):
    """Heads "honest" and "liar" (on other text), one replica of stages 1 and 2, snapshots every 2
    steps. The lease names the honest head first, then the liar for steps LIAR_FROM+1..CAUGHT; after
    the liar's step CAUGHT the test plays the coordinator: a lease without the liar (gone from the
    swarm, as a revoked head is) that carries `order`."""
    rng = random.Random(7)
    words = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "eiusmod"]
    evil = tmp_path / "evil.txt"
    evil.write_text(" ".join(rng.choice(words) for _ in range(20_000)))
    swarm = await make_swarm(spec, [0, 1, 1], snapshot_options=dict(every=2), driver_options=DRIVER)
    await swarm.add(0, "honest")
    liar = await swarm.add(0, "liar")
    liar.driver.batches = batches(spec, str(evil))
    assert not torch.equal(liar.driver.batches(LIAR_FROM, 0), batches(spec)(LIAR_FROM, 0))
    swarm.net.lease = ["honest", "liar"]
    revoked, tasks = [], []

    async def fresh_head_catches_the_liar() -> None:
        # a fresh head joins by download from the liar (its state has the liar's steps in it, and it holds no
        # snapshot of its stage), reads the liar's next step record (as it would), and the coordinator revokes
        # the liar: the new lease names the fresh head only (the liar, no longer named, drives nothing)
        head = await swarm.add(0, "fresh", announce="syncing")
        await head.join(["liar"])
        await head.announce("online")
        swarm.net.rollback = order
        swarm.kill("liar")
        await head.drive(STEPS, swarm.logs.append)

    def on_step(log) -> None:
        if log.step == LIAR_FROM and swarm.net.lease[0] == "honest" and not revoked:
            swarm.net.lease = ["liar", "honest"]
        elif fresh_head and log.step == LIAR_FROM + 1 and "honest" not in swarm.net.down:
            swarm.kill("honest")  # the honest head dies: the liar leads alone
        elif log.step == CAUGHT and swarm.net.lease[0] == "liar":
            revoked.append(log.step)
            if fresh_head:
                swarm.net.lease = ["fresh"]  # no head it names is live yet: the liar waits, and serves its state
                tasks.append(asyncio.ensure_future(fresh_head_catches_the_liar()))
            else:
                swarm.net.lease, swarm.net.rollback = ["honest"], order
                swarm.kill("liar")
    on_step.tasks = tasks
    return swarm, on_step


@pytest.mark.parametrize("fresh_head", [False, True], ids=["standby-head", "fresh-head"])
async def test_a_caught_liars_steps_are_rolled_back_and_leave_no_trace(tmp_path, caplog, fresh_head, oracle_runs):
    """standby-head: the head that leads next was a replica of stage 0 all along. fresh-head: the honest
    head died after the liar's first step, the liar led alone, and the head that catches it joined by
    download from the liar, so it holds no snapshot of stage 0: the rollback restores stage 0 from the
    custodians' copy."""
    spec = spec3()
    swarm, on_step = await liar_swarm(spec, tmp_path, RollbackOrder(1, LIAR_FROM, CAUGHT, "liar"), fresh_head)
    try:
        with caplog.at_level(logging.WARNING, logger="peer.state.rollback"):
            await asyncio.wait_for(swarm.drive(STEPS, on_step), 300)
            if fresh_head:  # the swarm's first heads are gone: the fresh one drives the rest
                await asyncio.wait_for(on_step.tasks[0], 300)
        await swarm.applied()
    finally:
        await swarm.stop()
    head = "fresh" if fresh_head else "honest"
    assert "liar" in swarm.net.down
    numbers = [log.step for log in swarm.logs]
    # steps 5-7 were driven by the liar, then again by the honest head after the rollback
    assert all(numbers.count(s) == 2 for s in range(LIAR_FROM + 1, CAUGHT + 1)), numbers
    assert all(swarm.peers[p].rollback.rollbacks == 1 for p in (head, "s1r0", "s2r0"))
    assert all(1 in swarm.peers[p].rollback.done for p in (head, "s1r0", "s2r0"))
    assert "orders its steps rolled back: every stage rolls back to step 4" in caplog.text
    clean = oracle_runs.weights(spec, STEPS)  # a run on the run's data only
    for stage, name in enumerate((head, "s1r0", "s2r0")):
        runner = swarm.peers[name].runner
        assert runner.step == STEPS
        for (pname, p), q in zip(runner.module.named_parameters(), clean[stage]):
            assert torch.allclose(p, q, rtol=1e-10, atol=1e-12), f"stage {stage} {pname}: the liar's steps left a trace"


async def test_with_no_snapshot_of_the_ordered_step_the_head_says_so_and_the_swarm_goes_on(tmp_path, caplog):
    spec = spec3()
    # step 2's snapshots are gone by step 7 (each store keeps its 2 newest: 4 and 6)
    swarm, on_step = await liar_swarm(spec, tmp_path, RollbackOrder(1, 2, CAUGHT, "liar"))
    try:
        with caplog.at_level(logging.WARNING, logger="peer.state.rollback"):
            await asyncio.wait_for(swarm.drive(STEPS, on_step), 300)
        await swarm.applied()
    finally:
        await swarm.stop()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "peer.state.rollback"]
    assert len(errors) == 1, caplog.text  # said once, not at every step
    assert "cannot roll back to step 2" in errors[0].getMessage()
    # the head is at step 6 or 7: the liar was gone before it told every replica to apply its step 7
    assert re.search(r"Steps 3-[67] trained on that head's data stay applied", errors[0].getMessage())
    numbers = [log.step for log in swarm.logs]
    # nothing rolled back: no step before the liar's last was driven twice (its step 7 may be, if the
    # liar was gone before the others applied it)
    assert sorted(set(numbers)) == list(range(1, STEPS + 1)), numbers
    assert all(numbers.count(s) == 1 for s in range(1, CAUGHT)), numbers
    assert all(swarm.peers[p].rollback.rollbacks == 0 for p in ("honest", "s1r0", "s2r0"))
    assert all(swarm.peers[p].runner.step == STEPS for p in ("honest", "s1r0", "s2r0"))

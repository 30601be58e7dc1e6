"""A head that joined by download may get the step it is about to drive applied by other means
(its donor forwards the step the swarm just committed). Its driver then logs no step of its
own: it neither re-drives a step the swarm is past nor reports another step's record."""
from __future__ import annotations

import asyncio
import threading
import time

from peer.runner.reduced import Reduced
from peer.runner.stage_error import StageError
from protocol.control import Command
from protocol.spec import preset
from tests.peer.swarm_in_memory import make_swarm, param_hash


async def test_a_step_forwarded_to_a_joined_head_while_it_starts_driving_is_not_logged_twice():
    spec = preset("tiny", stages=2, dtype="fp64", wire_dtype="fp64", batch_size=32, microbatch_size=8, lr=1e-3)
    swarm = await make_swarm(spec, [1, 1])
    donor = swarm.peers["s0r0"]
    try:
        await swarm.drive(2)
        late = await swarm.add(0, "s0a", announce="syncing")  # not a member yet: the donor still leads
        await late.join(["s0r0"])  # from here the donor forwards every step it applies
        assert late.runner.step == 2 and late.commit.records == []

        release = asyncio.Event()
        wait_for_switch = late.daemon.gate.wait_for_switch

        async def held(step: int) -> None:  # the late head starts its step, then stalls before driving it
            await release.wait()
            await wait_for_switch(step)

        late.daemon.gate.wait_for_switch = held
        pending = asyncio.create_task(late.driver.train_step())
        await donor.drive(3, swarm.logs.append)  # the donor commits step 3 and forwards it
        deadline = time.monotonic() + 60  # the margin of a loaded machine: how soon is not what this tests
        while late.runner.step != 3:
            assert time.monotonic() < deadline, "the forwarded step was not applied by the late head"
            await asyncio.sleep(0.01)  # poll the follower
        release.set()
        assert await asyncio.wait_for(pending, 60) is None
        assert late.commit.records == [] and late.runner.step == donor.runner.step == 3
        assert param_hash(late.runner) == param_hash(donor.runner)
        assert [log.step for log in swarm.logs] == [1, 2, 3]
    finally:
        await swarm.stop()


async def test_an_apply_that_finds_its_step_taken_by_a_forwarded_one_on_the_worker_is_answered_ok():
    """The take-over race (seen as a hung `test_liar_rollback[fresh-head]`): a head checks that it holds the
    sum of step s, then tells itself to apply it; meanwhile a forwarded step s, queued on the worker first,
    is applied and the sum is gone. The apply must say "applied already", not raise and end the driver."""
    spec = preset("tiny", stages=2, dtype="fp64", wire_dtype="fp64", batch_size=32, microbatch_size=8, lr=1e-3)
    swarm = await make_swarm(spec, [1, 1])
    try:
        await swarm.drive(1)
        head = swarm.peers["s0r0"]
        step, attempt = head.runner.step, head.daemon.attempt
        head.runner.reduced = Reduced(step, attempt, None, None, {"s0r0": [0]})
        gate = threading.Event()
        blocked = asyncio.ensure_future(head.daemon.run(gate.wait, 30))  # the worker is busy
        forwarded = asyncio.ensure_future(head.daemon.run(head.runner.apply_flat, step, None, None, True, True))
        apply = asyncio.ensure_future(head.commit.handle(Command(spec.run_hash, step, attempt, "apply"), local=True))
        deadline = time.monotonic() + 30
        while head.daemon._worker._work_queue.qsize() < 2:  # the apply passed its check; its job waits behind
            assert time.monotonic() < deadline and not apply.done(), "the apply queued no job"
            await asyncio.sleep(0.01)  # poll the worker's queue
        gate.set()
        await asyncio.gather(blocked, forwarded)
        reply = await asyncio.wait_for(apply, 30)
        assert (reply.outcome, head.runner.step) == ("ok", step + 1), reply
        assert head.commit.records[-1].step == step - 1  # the forwarded step was not logged as this head's apply
    finally:
        await swarm.stop()


async def test_a_take_over_that_fails_on_its_own_stage_is_tried_again_and_does_not_end_the_driver(caplog):
    """A `StageError` out of a take-over (the stage moved under it) must not end the drive task: the head
    looks for the leader again, takes over with its stage as it is now and trains on."""
    spec = preset("tiny", stages=2, dtype="fp64", wire_dtype="fp64", batch_size=32, microbatch_size=8, lr=1e-3)
    swarm = await make_swarm(spec, [1, 1])
    head = swarm.peers["s0r0"]
    real, failed = head.driver._take_over, []

    async def once() -> bool:
        if not failed:
            failed.append(True)
            raise StageError("no reduced gradient is held for attempt 0 of step 0.")
        return await real()

    head.driver._take_over = once
    try:
        logs = await asyncio.wait_for(swarm.drive(2), 120)
    finally:
        await swarm.stop()
    assert failed == [True] and [log.step for log in logs] == [1, 2]
    assert "taking over the lead failed" in caplog.text

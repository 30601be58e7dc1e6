"""A head at a switch step (a re-fit's effective step) waits, bounded, for the coordinator's basis update
(`BasisGate.wait_for_switch`); with no coordinator in the seat (`updates_come` says so) it takes what it can pull
once and goes on at once on its basis, instead of waiting the whole bound at every switch step (30 s every
`basis_interval` steps: the steps a swarm without a coordinator lost, seen in tests/e2e/test_no_coordinator.py)."""
from __future__ import annotations

import time

import pytest

from peer.daemon.basis_gate import BasisGate
from peer.runner.stage import StageRunner
from protocol.spec import preset

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

SPEC = preset("tiny", stages=2, codec="subspace", basis_interval=5)  # switch delay 2: step 7 is a switch step


async def _on_worker(fn, *args):
    return fn(*args)


async def test_a_head_goes_on_at_once_at_a_switch_step_when_no_coordinator_holds_the_seat():
    runner = StageRunner(SPEC, 0, "cpu")
    pulls = []

    async def pull() -> None:
        pulls.append(time.monotonic())

    async def none_comes() -> bool:
        return False

    async def may_come() -> bool:
        return True

    gate = BasisGate(runner, _on_worker, pull_updates=pull, wait=1.0)
    gate.updates_come = none_comes
    t0 = time.monotonic()
    await gate.wait_for_switch(7)
    assert time.monotonic() - t0 < 0.5 and len(pulls) == 1  # pulled once (an update signed earlier), then on
    gate.updates_come = may_come
    t0 = time.monotonic()
    await gate.wait_for_switch(7)
    assert time.monotonic() - t0 >= 1.0  # a coordinator in the seat: the update may be on its way
    pulls.clear()
    await gate.wait_for_switch(8)  # not a switch step: no wait at all
    assert pulls == []

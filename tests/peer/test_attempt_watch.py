"""A peer that dies holding a microbatch ends the attempt within seconds (`AttemptWatch`), not at
the attempt's timeout, and the re-driven step still equals the one-process run (in memory, fp64).

The victim crashes the way a SIGKILLed process does: right after it acknowledged a microbatch
it answers nothing and sends nothing, while its announcement lives on (until a ttl the test
plays out 3 s later)."""
from __future__ import annotations

import asyncio
import logging

from peer.daemon.interfaces import LinkError
from peer.daemon.loopback import LoopbackLink
from peer.replica.memory_swarm import TEST_DRIVER_OPTIONS
from protocol.spec import preset
from protocol.wire import KIND_ACTIVATION
from tests.peer.swarm_in_memory import make_swarm
from tests.peer.test_replicas import SMALLER

STEPS, VICTIM = 5, "s1r1"


class CrashableLink(LoopbackLink):
    """A loopback link through which a crashed peer (in `net.crashed`) neither answers nor sends."""

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        crashed = getattr(self.net, "crashed", set())
        if peer in crashed or self.peer_id in crashed:
            raise LinkError(f"peer {peer} is gone.")
        return await super().request(peer, kind, body, timeout)


async def test_a_peer_that_dies_holding_a_microbatch_ends_the_attempt_in_seconds(caplog, oracle_runs):
    # tiny narrowed as in test_replicas (SMALLER): the watch's pings do not depend on the width, the steps do
    spec = preset("tiny", stages=3, codec="subspace", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3, **SMALLER)
    # an attempt would time out after 60 s: only the watch can end it within the test's 45 s
    driver = dict(TEST_DRIVER_OPTIONS, min_timeout=60.0, first_timeout=60.0, watch_period=0.2)
    swarm = await make_swarm(spec, [1, 2, 1], CrashableLink, driver_options=driver)
    swarm.net.crashed = set()
    handler = swarm.net.handlers[(VICTIM, KIND_ACTIVATION)]

    async def crash_after_taking_one(body: bytes, sender: str) -> bytes:
        reply = await handler(body, sender)
        if len(swarm.logs) >= 2 and not swarm.net.crashed:  # a microbatch of step 3 was taken: crash now
            swarm.net.crashed.add(VICTIM)
            asyncio.get_running_loop().call_later(3.0, swarm.net.status.pop, VICTIM, None)  # its record expires
        return reply
    swarm.net.handlers[(VICTIM, KIND_ACTIVATION)] = crash_after_taking_one
    try:
        with caplog.at_level(logging.WARNING, logger="peer.step.driver"):
            logs = await asyncio.wait_for(swarm.drive(STEPS), 45)
            await swarm.applied()
    finally:
        await swarm.stop()
    assert swarm.net.crashed == {VICTIM}, "the victim never took a microbatch after step 2: nothing was tested"
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage() and "re-driving" in r.getMessage()]
    assert failed and all("stopped answering" in m for m in failed), failed
    assert VICTIM[-8:] in failed[0]
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    assert logs[2].attempts >= 2, "step 3 was not re-driven"
    for log, want in zip(logs, oracle_runs.losses(spec, STEPS)):
        assert abs(log.loss - want) <= 1e-10 * abs(want), f"step {log.step}: swarm {log.loss!r} vs oracle {want!r}"

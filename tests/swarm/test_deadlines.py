"""A replica that accepts a microbatch and never answers (issue 20) is banned at its first missed
deadline and the microbatch goes to another replica at once: the step finishes in its first
attempt, seconds after the deadline, and equals the one-process run (exactly once, in fp64).
Newcomers are on probation: 40 unproven ids of a stage draw one microbatch, not 40/41 of them.

The swarm is in memory, but every peer routes with the real `Router` (probation, bans), reading
the loopback network's announcements instead of the DHT."""
from __future__ import annotations

import asyncio

import pytest

from peer.daemon.loopback import LoopbackNetwork
from peer.replica.memory_swarm import TEST_DRIVER_OPTIONS, MemorySwarm
from protocol.spec import preset
from protocol.wire import KIND_ACTIVATION
from swarm.dht import StageAnnouncement
from swarm.replicas.router import Router
from tests.peer.test_replicas import SMALLER

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

STEPS, SILENT = 8, "s1zz"


class LoopbackRouter(Router):
    """A peer's real Router over the loopback network's announcements."""

    def __init__(self, net: LoopbackNetwork, peer_id: str) -> None:
        super().__init__(dht=None, run_hash="r", peer_id=peer_id, maddrs=[], cache_seconds=0.0)
        self.net = net

    async def announced(self, stage: int, fresh: bool = False, recent: bool = False) -> list[StageAnnouncement]:
        return [StageAnnouncement(p, "r", st.stage, [], st.throughput, 0, 0, st.state, "0", step=st.step,
                                  leads=st.leads)
                for p, st in sorted(self.net.status.items()) if st.stage == stage and p not in self.net.down]

    async def announce(self, status) -> None:
        if self.peer_id not in self.net.down:
            self.net.status[self.peer_id] = status

    async def lease_order(self, fresh: bool = False) -> list[str] | None:
        return None  # no coordinator: the rule without a lease


class RouterNetwork(LoopbackNetwork):
    def directory(self, peer_id: str) -> LoopbackRouter:
        return LoopbackRouter(self, peer_id)


async def test_a_replica_that_accepts_and_never_answers_is_banned_at_its_first_deadline(oracle_runs):
    # tiny narrowed as in test_replicas (SMALLER): the deadline is its floor at either width, the steps are shorter
    spec = preset("tiny", stages=3, codec="subspace", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3, **SMALLER)
    # an attempt times out after 60 s: a step that waited for the silent replica would show it
    swarm = MemorySwarm(spec, RouterNetwork(), driver_options=dict(TEST_DRIVER_OPTIONS, min_timeout=60.0,
                                                                   first_timeout=60.0))
    for name, stage in (("s0r0", 0), ("s1r0", 1), ("s2r0", 2)):
        await swarm.add(stage, name)
    taken = []

    async def silent(body: bytes, sender: str) -> bytes:
        taken.append(sender)
        return b""  # accepted; its gradient never comes

    deadlines = []

    def on_step(log) -> None:
        if log.step == 2:  # round trips are measured: the silent replica announces itself for stage 1
            swarm.net.handlers[(SILENT, KIND_ACTIVATION)] = silent
            asyncio.get_running_loop().create_task(LoopbackRouter(swarm.net, SILENT).announce(
                swarm.peers["s1r0"].status("online")))
            deadlines.append(swarm.peers["s0r0"].daemon.deadline())
    try:
        logs = await asyncio.wait_for(swarm.drive(STEPS, on_step), 120)
        await swarm.applied()
    finally:
        await swarm.stop()
    head = swarm.peers["s0r0"].daemon
    router = head.directory
    assert taken == ["s0r0"], f"the silent replica took {len(taken)} microbatches (probation allows one)"
    assert router.banned_peers() == {SILENT: 1}  # banned once (for 5 s: it may have run out by now)
    assert head.missed_deadlines == 1
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    assert all(log.attempts == 1 for log in logs), [log.attempts for log in logs]
    print("steps (s):", [round(log.seconds, 2) for log in logs], "deadline", deadlines)
    slow = max(logs[2:], key=lambda log: log.seconds)
    assert deadlines[0] is not None and slow.seconds < deadlines[0] + 10.0, \
        f"step {slow.step} took {slow.seconds:.1f} s with a {deadlines[0]} s deadline"
    for log, want in zip(logs, oracle_runs.losses(spec, STEPS)):
        assert abs(log.loss - want) <= 1e-10 * abs(want), f"step {log.step}: swarm {log.loss!r} vs oracle {want!r}"

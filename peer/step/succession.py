"""`Succession`: which head leads as this head sees it, and how a standby head watches the leader
(`StepDriver`, peer/step/driver.py; the rule itself is `leader_of`, peer/step/leadership.py).

A head that stops answering the standby heads' pings, or this head while it is behind the swarm, is set aside
for a while: `leader_of` then passes over it, so the next head in line leads at once.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from peer.daemon.daemon import StageDaemon
from peer.daemon.interfaces import PeerDirectory, PeerInfo
from protocol.control import CommandReply

from .calibration import Calibration
from .leadership import leader_of

log = logging.getLogger(__name__)


class Succession:
    def __init__(self, daemon: StageDaemon, directory: PeerDirectory,
                 command: Callable[..., Awaitable[CommandReply]], calibration: Calibration | None,
                 ping_period: float, ping_failures: int) -> None:
        self.daemon, self.directory, self.command, self.calibration = daemon, directory, command, calibration
        self.runner, self.peer_id = daemon.runner, daemon.peer_id
        self.ping_period, self.ping_failures = ping_period, ping_failures
        self.dead: dict[str, float] = {}  # heads that stopped answering -> when we may try them again

    def set_aside(self, peer: str, seconds: float) -> None:
        self.dead[peer] = time.monotonic() + seconds

    def is_set_aside(self, peer: str) -> bool:
        return self.dead.get(peer, 0.0) > time.monotonic()

    def take_back(self) -> list[str]:
        """Every other head set aside for not answering is a candidate again; returns them."""
        back = [p for p in self.dead if p != self.peer_id]
        for peer in back:
            del self.dead[peer]
        return back

    async def leader(self, leading: bool) -> str:
        """`leader_of` over the live heads this head sees, itself included (`leading`: it claims the lead now),
        less those it found dead."""
        waited = False
        while True:
            now = time.monotonic()
            me = PeerInfo(self.peer_id, 0, "online", self.runner.step, 0.0, leading)
            heads = [p for p in await self.directory.members(0) if p.peer_id != self.peer_id] + [me]
            order = await self.directory.lease_order(fresh=waited)  # waiting: the lease may have just come
            leader = leader_of((p for p in heads if self.dead.get(p.peer_id, 0.0) <= now), order)
            if leader is not None:
                return leader
            if order is not None and not waited:
                waited = True
                log.info("no live head holds the coordinator's lease yet (lease: %s); waiting for one",
                         ", ".join(p[-8:] for p in order) or "none granted")
            # every head, this one too, is set aside for now (this one is behind), or none holds the
            # lease yet: look again soon
            ends = [self.dead[p.peer_id] - now for p in heads if p.peer_id in self.dead]
            await asyncio.sleep(min(5.0, max(0.5, min(ends, default=0.5))))

    async def stand_by(self, leader: str) -> None:
        """Ping the leader; after `ping_failures` failures in a row, count it as dead for a while
        (the others check for themselves: each peer probes a leader it still sees before it
        follows this head, `swarm/replicas/membership.py`)."""
        failures, pings = 0, 0
        step = self.runner.step
        if self.calibration is not None:
            self.calibration.start()  # on the worker, while the pings go on
        while failures < self.ping_failures:
            reply = await self.command(leader, "status", step, 0, timeout=max(1.0, self.ping_period * 2))
            failures, pings = failures + 1 if reply.outcome == "failed" else 0, pings + 1
            if self.runner.step != step and failures == 0:
                return  # the swarm moves on under the leader: look again
            if failures == 0 and pings % 5 == 0 and await self.leader(False) != leader:
                return  # another head claimed the lead meanwhile (two heads started together)
            await asyncio.sleep(self.ping_period)  # the ping interval of a standby head
        log.warning("head %s stopped answering; the next head in line takes over", leader[-8:])
        self.set_aside(leader, 60.0)
        self.directory.report_failure(leader)

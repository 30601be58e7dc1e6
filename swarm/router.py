"""`Router`: picks the next-stage peer from the DHT's stage announcements.

Live peers only (unexpired, "online", same basis version when known), throughput-weighted:
the least queued, fastest peer first. A peer that failed is banned for a backoff that
doubles with each failure. With no live peer, it polls the DHT until a deadline and then
raises one clear error. It also implements the peer's `PeerDirectory` interface (announce).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from peer.interfaces import LinkError, PeerStatus

from . import __version__
from .dht import StageAnnouncement, SwarmDHT

log = logging.getLogger(__name__)


@dataclass
class _Ban:
    until: float
    failures: int


@dataclass
class Router:
    dht: SwarmDHT
    run_hash: str
    peer_id: str
    maddrs: list[str]
    ttl: float = 20.0
    pick_timeout: float = 60.0
    cache_seconds: float = 2.0
    base_ban: float = 5.0
    _cache: dict[int, tuple[float, list[StageAnnouncement]]] = field(default_factory=dict)
    _bans: dict[str, _Ban] = field(default_factory=dict)
    last_status: PeerStatus | None = None

    # ---------------------------------------------------------------- PeerDirectory
    def announcement(self, status: PeerStatus) -> StageAnnouncement:
        return StageAnnouncement(self.peer_id, self.run_hash, status.stage, self.maddrs, float(status.throughput),
                                 int(status.queue), int(status.basis_version), status.state, __version__)

    async def announce(self, status: PeerStatus) -> None:
        self.last_status = status
        if not await self.dht.announce(self.announcement(status), self.ttl):
            log.warning("the DHT did not store this peer's announcement; it will retry on the next heartbeat")

    async def live_peers(self, stage: int, fresh: bool = False) -> list[StageAnnouncement]:
        now = time.monotonic()
        cached = self._cache.get(stage)
        if fresh or cached is None or now - cached[0] > self.cache_seconds:
            peers = await self.dht.stage_peers(self.run_hash, stage)
            self._cache[stage] = (now, peers)
        else:
            peers = cached[1]
        return [p for p in peers if p.state == "online"]

    async def pick(self, stage: int, exclude: set[str] = frozenset()) -> str:
        deadline = time.monotonic() + self.pick_timeout
        fresh = False
        while True:
            now = time.monotonic()
            candidates = [p for p in await self.live_peers(stage, fresh)
                          if p.peer_id not in exclude and self._bans.get(p.peer_id, _Ban(0, 0)).until <= now]
            if candidates:
                best = min(candidates, key=lambda p: (p.queue, -p.throughput, p.peer_id))
                return best.peer_id
            if time.monotonic() >= deadline:
                raise LinkError(f"no live peer serves stage {stage} (waited {self.pick_timeout:g} s); "
                                f"start one with `swarm peer --stage {stage} --initial-peers ...`.")
            fresh = True
            await asyncio.sleep(0.25)  # poll interval of the DHT while waiting for a peer to appear

    def report_failure(self, peer: str) -> None:
        ban = self._bans.get(peer, _Ban(0, 0))
        ban.failures += 1
        ban.until = time.monotonic() + self.base_ban * 2 ** (ban.failures - 1)
        self._bans[peer] = ban
        self._cache.clear()
        log.warning("peer %s failed; avoiding it for %.0f s", peer[-8:], ban.until - time.monotonic())

    def banned_peers(self) -> dict[str, int]:
        """Peers this router saw fail -> their failure count, most failures first (for health reports)."""
        return {peer: ban.failures for peer, ban in sorted(self._bans.items(), key=lambda kv: -kv[1].failures)}

    async def wait_for_coverage(self, n_stages: int, timeout: float) -> dict[int, int]:
        """Poll until every stage has a live peer; returns peers per stage or raises LinkError."""
        deadline = time.monotonic() + timeout
        while True:
            counts = {s: len(await self.live_peers(s, fresh=True)) for s in range(n_stages)}
            if all(counts.values()):
                return counts
            if time.monotonic() >= deadline:
                missing = [s for s, c in counts.items() if not c]
                raise LinkError(f"stages {missing} have no live peer after {timeout:g} s; start a peer for each "
                                f"with `swarm peer --stage N --initial-peers ...`.")
            await asyncio.sleep(0.25)

"""Which coordinator holds the seat, as any peer reads it (`ActiveCoordinator`), and the one rule every reader
and claimant applies (`seat_holder`; how claims are made: swarm/coordinator/seat.py)."""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from hivemind.utils import get_dht_time

from .records import CoordinatorClaim

log = logging.getLogger(__name__)

REFRESH_S = 5.0  # a peer reads the claims again at most this often


def seat_holder(claims: Sequence[CoordinatorClaim], now: float) -> CoordinatorClaim | None:
    """The claim that holds the seat at DHT time `now`: of the live ones (now < until) the highest term, then the
    lowest peer id; None while no claim is live (every coordinator down)."""
    live = [c for c in claims if c.until > now]
    return min(live, key=lambda c: (-c.term, c.peer_id)) if live else None


class ActiveCoordinator:
    """Where a peer sends what goes to the coordinator (statistics, work records, data reports): the seat's holder,
    read from the DHT at most every `refresh_s`; with no live claim, the newest term's coordinator, and with no
    claim at all (a coordinator of an older version) the run spec's `coordinator_peer`. Who is asked for what any
    coordinator holds (its snapshots, the tokenizer, a dial-back): `peer_ids`."""

    def __init__(self, sdht, run_hash: str, spec_peer: str = "", refresh_s: float = REFRESH_S) -> None:
        self.sdht, self.run_hash, self.spec_peer, self.refresh_s = sdht, run_hash, spec_peer, refresh_s
        self.claim: CoordinatorClaim | None = None  # the holder as last read (None: no live claim)
        self.newest: CoordinatorClaim | None = None  # the claim of the highest term, live or not
        self.claims: list[CoordinatorClaim] = []  # every claim as last read
        self._read = float("-inf")

    async def refresh(self, force: bool = False) -> CoordinatorClaim | None:
        """Read the claims (unless read less than `refresh_s` ago); the holder, or None."""
        if not force and time.monotonic() - self._read < self.refresh_s:
            return self.claim
        self._read = time.monotonic()
        try:
            claims = await self.sdht.fetch_claims(self.run_hash)
        except Exception as e:  # the DHT may not answer: keep the last reading
            log.debug("could not read the coordinator claims: %s", e)
            return self.claim
        self.claims = list(claims)
        self.claim = seat_holder(claims, get_dht_time())
        self.newest = max(claims, key=lambda c: (c.term, c.since), default=self.newest)
        return self.claim

    async def lapsed(self) -> bool:
        """Whether no coordinator holds the seat although one did: every claim read has lapsed (all coordinators
        down, or a standby not yet in the seat). False while a claim is live, and where none was ever read (a
        coordinator of an older version, which claims no seat)."""
        await self.refresh()
        return self.claim is None and self.newest is not None

    async def peer_id(self) -> str:
        """The peer id to send to ("" if this run names no coordinator at all)."""
        await self.refresh()
        found = self.claim or self.newest
        return found.peer_id if found is not None else self.spec_peer

    async def peer_ids(self) -> list[str]:
        """The coordinators to ask for what any of them holds, in order: the seat's holder, then the others whose
        claims are live (a standby in the same moment's race, a holder paused but not yet lapsed); with none live,
        the newest term's; with no claim ever read, the run spec's `coordinator_peer` ([] if there is none)."""
        await self.refresh()
        now = get_dht_time()
        live = sorted((c for c in self.claims if c.until > now), key=lambda c: (-c.term, c.peer_id))  # seat_holder's
        found = [c.peer_id for c in live] or ([self.newest.peer_id] if self.newest is not None else [])
        return list(dict.fromkeys(found)) if found else [p for p in [self.spec_peer] if p]

"""`CoordinatorSeat`: which of the coordinators that hold the swarm key is the active one.

The holder of the swarm key may run several coordinators (`swarm coordinator --standby` on other
machines, the same key). Each files a `CoordinatorClaim` in the DHT (`swarm/dht/records.py`), signed by
the key, under its own subkey, so that claims stand side by side. Every reader applies one rule:

    seat = the live claim (DHT time < until) of the highest term; of one term, the lowest peer id

A coordinator without the seat looks every POLL_S (jittered). If no live claim is another's, it claims

    term = 1 + max(term of every claim it reads, live or not, and of its own last claim)

waits SETTLE_S (for a rival's claim of the same moment to reach the DHT), reads again and holds the
seat if the rule gives it and no other claim appeared since its first read. A claim that appeared between
the two reads is a rival of the same moment, which may have decided before this claim reached the DHT (a
store slower than SETTLE_S, as on a loaded machine): this one then withdraws its claim (`until` = now) and
stands by. Of two such rivals at most one holds: the one that holds read no new claim, so the other's claim
landed after that read, and that other reads the holder's claim as new. (Both may stand by; the jitter of
the next round parts them.) The run's first claim waits too: a standby that read
the run spec from peers (every coordinator gone for a day, its claims expired) may claim beside a
restarted coordinator. The holder renews its claim every RENEW_S
(`until` = now + SEAT_TTL_S) and reads the claims each time: one of a higher term (a standby that took the
seat while this one was paused) takes the seat from it at once; one of its own term is a rival that stood by.

Signing is fenced (`may_sign`, asked by `SwarmDHT` before every swarm-key write): the holder signs only
while, by its own monotonic clock,

    t < t_renew + SEAT_TTL_S - MARGIN_S       (t_renew: when its last successful renewal began)

A standby claims only once the holder's claim is no longer live to it, and signs SETTLE_S later still.
So, with clocks apart by less than MARGIN_S + SETTLE_S (6 s), no two coordinators sign in the same
moment: a holder paused (SIGSTOP) past its term wakes with its fence shut, reads the claims and stands
by; one that missed its renewals for any reason stops its duties when its fence shuts. The takeover
after the holder dies takes at most SEAT_TTL_S + POLL_S + SETTLE_S (16 s; the issue asks 30).
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from hivemind.utils import get_dht_time

from swarm.dht import CoordinatorClaim, SwarmDHT
from swarm.dht.seat_reader import seat_holder

log = logging.getLogger(__name__)

SEAT_TTL_S = 12.0  # a claim is live this long after its last renewal
RENEW_S = 3.0  # the holder renews this often (4 renewals may fail before its claim lapses)
POLL_S = 2.0  # a coordinator without the seat reads the claims this often
SETTLE_S = 2.0  # between a claim and the read that decides it (a rival's store of the same moment is done by then)
MARGIN_S = 4.0  # the holder stops signing this long before its claim lapses
CLAIM_KEPT_S = 86400.0  # a claim stays readable this long: later terms are numbered after it


class CoordinatorSeat:
    """One coordinator's part in the seat: `hold()` returns once it holds it; `watch()` returns once it lost it."""

    def __init__(self, sdht: SwarmDHT, run_hash: str, peer_id: str, maddrs: Callable[[], list[str]] = list, *,
                 ttl: float = SEAT_TTL_S, renew_s: float = RENEW_S, poll_s: float = POLL_S,
                 settle_s: float = SETTLE_S, margin_s: float = MARGIN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < renew_s < ttl - margin_s:
            raise ValueError("the seat's renewal period must be shorter than its ttl less the signing margin.")
        self.sdht, self.run_hash, self.peer_id, self.maddrs = sdht, run_hash, peer_id, maddrs
        self.ttl, self.renew_s, self.poll_s, self.settle_s, self.margin_s = ttl, renew_s, poll_s, settle_s, margin_s
        self.clock = clock
        self.claim: CoordinatorClaim | None = None  # this coordinator's claim while it holds the seat
        self.last_term = 0
        self.holder: CoordinatorClaim | None = None  # the seat as last read
        self._renewed = float("-inf")  # monotonic start of the last successful renewal
        self._jitter = random.Random()
        sdht.seat_fence = self.may_sign

    def may_sign(self) -> bool:
        """Whether this coordinator may sign for the swarm now (the fence of the module docstring)."""
        return self.claim is not None and self.clock() < self._renewed + self.ttl - self.margin_s

    @property
    def term(self) -> int:
        return self.claim.term if self.claim is not None else 0

    async def read(self) -> list[CoordinatorClaim]:
        claims = await self.sdht.fetch_claims(self.run_hash)
        self.holder = seat_holder(claims, get_dht_time())
        self.last_term = max([self.last_term, *(c.term for c in claims)])
        return claims

    async def hold(self) -> CoordinatorClaim:
        """Wait until this coordinator holds the seat (standing by while another does); returns its claim."""
        said = None
        while True:
            try:
                claim = await self._try_claim()
                if claim is not None:
                    return claim
                if self.holder is not None and self.holder.peer_id != said:
                    said = self.holder.peer_id
                    log.info("standing by: coordinator %s holds the seat (term %d, since %s)", said[-8:],
                             self.holder.term, _when(self.holder.since))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the DHT may not answer yet: look again
                log.warning("could not read the coordinator claims (%s: %s); retrying", type(e).__name__, e)
            await asyncio.sleep(self.poll_s * self._jitter.uniform(0.5, 1.5))  # parts rivals that stood by at once

    async def _try_claim(self) -> CoordinatorClaim | None:
        seen = await self.read()
        now = get_dht_time()
        if any(c.peer_id != self.peer_id and c.until > now for c in seen):
            return None  # another holds the seat, or claimed it a moment ago
        mine = CoordinatorClaim(self.run_hash, self.last_term + 1, self.peer_id, now, now + self.ttl, self.maddrs())
        started = self.clock()
        if not await self.sdht.publish_claim(mine, CLAIM_KEPT_S):
            log.warning("the DHT did not store this coordinator's claim to the seat; retrying")
            return None
        self.last_term = mine.term
        await asyncio.sleep(self.settle_s)  # a rival that claimed in the same moment is read now
        before = {(c.peer_id, c.term, c.since) for c in seen}
        rivals = [c for c in await self.read() if c.peer_id != self.peer_id and c.until > get_dht_time()
                  and (c.peer_id, c.term, c.since) not in before]
        if rivals or self.holder is None or self.holder.peer_id != self.peer_id or self.holder.term != mine.term:
            who = rivals[0] if rivals else self.holder
            log.info("coordinator %s claimed the seat in the same moment: standing by",
                     who.peer_id[-8:] if who else "none (this claim did not reach the DHT)")
            await self._withdraw(mine)
            return None
        self.claim, self._renewed = mine, started
        log.info("this coordinator holds the seat: term %d, since %s", mine.term, _when(mine.since))
        return mine

    async def watch(self) -> str:
        """Renew the claim until the seat is lost; returns why (and the fence is shut by then)."""
        while True:
            await asyncio.sleep(self.renew_s)
            why = await self._renew()
            if why is not None:
                self.claim = None
                log.warning("this coordinator gave up the seat: %s", why)
                return why

    async def _renew(self) -> str | None:
        """One renewal; why the seat is lost, or None."""
        if not self.may_sign():  # paused, or its renewals failed for too long: its claim may have lapsed
            return "its claim may have lapsed (the process was paused, or the DHT did not answer)"
        started = self.clock()
        try:
            await self.read()
            if self.holder is not None and self.holder.peer_id != self.peer_id and self.holder.term > self.claim.term:
                return f"coordinator {self.holder.peer_id[-8:]} holds it (term {self.holder.term})"
            now = get_dht_time()
            claim = CoordinatorClaim(self.run_hash, self.claim.term, self.peer_id, self.claim.since, now + self.ttl,
                                     self.maddrs())
            if await self.sdht.publish_claim(claim, CLAIM_KEPT_S):
                self.claim, self._renewed = claim, started
            else:
                log.warning("the DHT did not store the renewal of this coordinator's claim; retrying")
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("could not renew this coordinator's claim (%s: %s); retrying", type(e).__name__, e)
        return None

    async def resign(self) -> None:
        """Leave the seat now (a clean stop): a standby need not wait for the claim to lapse."""
        if self.claim is None:
            return
        claim, self.claim = self.claim, None
        await self._withdraw(claim)

    async def _withdraw(self, claim: CoordinatorClaim) -> None:
        """Store `claim` as lapsed now, so that readers stop naming it."""
        try:
            await self.sdht.publish_claim(CoordinatorClaim(self.run_hash, claim.term, self.peer_id, claim.since,
                                                           get_dht_time(), claim.maddrs), CLAIM_KEPT_S)
        except Exception as e:  # the claim lapses by itself
            log.debug("could not withdraw this coordinator's claim: %s", e)


def _when(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))

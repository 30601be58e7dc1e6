"""`LeaseKeeper`: the coordinator's grant of the leader lease, the one record that says which
heads may lead, in order, signed by the swarm key (`LeaderLease` in `swarm/dht/records.py`;
how peers read it: `peer/step/leadership.py`).

Every `period` seconds the keeper reads the heads' announcements (stage 0) and computes

    present  = heads announced online or paused, less the first head of the order if it failed
               `probe_failures` liveness probes in a row (a killed head's record outlives it: it
               stays out until it announces again), in the order the keeper first saw them; heads
               first seen in the same round in the order of blake2b(salt, peer id), salt a secret
               of this keeper (the id order was a stranger's to win by grinding a low id)
    held     = heads of the previous order whose record is missing (not one that announced another
               state) and that were present less than `absent_grace_s` ago: a heartbeat that came
               late or a DHT read that missed one record must not send an honest head to the back
               of the order, behind every head that joined after it
    eligible = the --trusted-heads that are present, in the order given        if pinned
             = the present heads, in the order the keeper first saw them       otherwise
               less the revoked heads (caught feeding other data: `data_check.py`), for good
    order    = the heads of the previous order still eligible (or held), in place, then the newly eligible
    lease    = [p in order that did checked work] + [p in order that did not]     (unless pinned)

where "did checked work" means a leading head's signed work record (`note_work`, protocol/step_record.py)
named it among stage 0's workers: it drove microbatches of a committed step, under the spot checks.
A stranger that only announces stage 0 (ids are cheap; 3 such heads stretched a failover from ~4 s
to 12.7 s while the lease named them first in line) therefore comes after every head that worked,
however early it announced; a real head enters the line ahead of them at the first snapshot step
after it worked (the leader's records name workers at snapshot and re-fit steps). With nobody vetted
(a new swarm, a coordinator just restarted: it keeps no list) the order is the one above.

and signs a lease with a higher `term` whenever `order` changes; unchanged, the lease is stored
again every `republish_s`. A revocation may order a rollback (`revoke(..., rollback_to=S)`: the
caught head's steps are undone back to the snapshot step S, `peer/state/rollback.py`); the order is
numbered by the revocations so far and stays in every later lease until the next one.

The revoked list is bounded (a stored lease carries at most `MAX_REVOKED`, swarm/dht/records.py), and
revocations are cheap to cause: any announced head that reports honest data as false, or refuses it, is
revoked, and ids are free. So past the bound the keeper drops the oldest revocation of a head that cost
nothing, never one that did: a head revoked for data it fed while it led, or one a leader's work record
named among stage 0's workers (`worked`), stays revoked while any costless revocation is left to drop
(revocations read from a stored lease count as costly: the keeper cannot tell). Dropping a costless
revocation gives its id back nothing a fresh id would not have: a head that never did checked work goes
behind every head that did in the order anyway.
With the keeper away (the coordinator stopped) the heads go on
following the newest lease they read: its order names the successors.

Why this order: it is what a stranger cannot buy. A head that joins comes after every head
already there, whatever its id (5,000 Ed25519 ids cost 0.3 s, so "lowest id leads" was the
stranger's to take), and a head that left (announced "leaving", was found dead, or was missing for
longer than the grace) comes back last. A held head that is really gone costs nothing: every peer
follows the first head of the order that it sees live (`peer/step/leadership.py`). What it does not
stop: a stranger that outlives every honest head leads in the end; `--trusted-heads` pins
the heads that may lead at all.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence

from swarm.dht import LeaderLease, SwarmDHT
from swarm.dht.records import MAX_REVOKED

from .router import LIVE_STATES

log = logging.getLogger(__name__)

LEASE_TTL_S = 3600.0  # how long a stored lease lives without the coordinator (its heads cache it beyond that)
ABSENT_GRACE_S = 30.0  # a head whose record lapsed keeps its place this long (several of its heartbeats)
WORKED_KEPT = 4096  # heads remembered as having done checked work (the oldest forgotten first)


def next_order(previous: Sequence[str], present: Sequence[str], trusted: Sequence[str] = (),
               revoked: Sequence[str] = ()) -> list[str]:
    """The lease order after `previous`, given the heads `present` now (in the order first seen),
    the pinned `trusted` heads (empty: any present head may lead) and the `revoked` ones (never)."""
    eligible = [p for p in trusted if p in present] if trusted else list(present)
    eligible = [p for p in eligible if p not in revoked]
    kept = [p for p in previous if p in eligible]
    return kept + [p for p in eligible if p not in kept]


class LeaseKeeper:
    def __init__(self, sdht: SwarmDHT, run_hash: str, probe: Callable[[str], Awaitable[bool]] | None = None, *,
                 trusted: Sequence[str] = (), period: float = 1.0, republish_s: float = 30.0,
                 probe_failures: int = 2, on_revoke: Callable[[LeaderLease], Awaitable[object]] | None = None,
                 absent_grace_s: float = ABSENT_GRACE_S, clock: Callable[[], float] = time.monotonic,
                 salt: bytes | None = None, ttl: float = LEASE_TTL_S) -> None:
        self.sdht, self.run_hash, self.probe, self.trusted = sdht, run_hash, probe, list(trusted)
        self.period, self.republish_s, self.probe_failures = period, republish_s, probe_failures
        self.absent_grace_s, self.clock = absent_grace_s, clock
        self.ttl = ttl  # the stored lease's life without the keeper (`swarm coordinator --record-ttl` shortens it)
        self._salt = salt if salt is not None else os.urandom(16)  # ties among heads first seen together
        self.lease: LeaderLease | None = None
        self.revoked: list[str] = []
        self._costly: set[str] = set()  # revoked heads that led or did checked work: kept past MAX_REVOKED
        self.rollback: tuple[int, int, int, str] = (0, 0, 0, "")  # (number, to, caught, head) of the last order
        self.on_revoke = on_revoke  # after a revocation is stored: e.g. tell every peer to read the lease now
        self._lock = asyncio.Lock()
        self._first_seen: dict[str, float] = {}
        self._failures: dict[str, int] = {}  # first head of the order -> its probe failures in a row
        self._last_present: dict[str, float] = {}  # head -> when a round last found it present
        self._gone: dict[str, float] = {}  # head dropped as dead -> the timestamp of its record then
        self._stored = float("-inf")
        self.worked: dict[str, None] = {}  # heads a leader's work record named among stage 0's workers, oldest first
        self._loaded = False  # whether the stored lease was read (`load`)

    def note_work(self, record) -> None:
        """A leading head's signed `WorkRecord` (checked by the caller: signed, from a head the lease names): the
        heads it names among stage 0's workers did checked work, and may go ahead of heads that did none."""
        for peer in record.workers.get(0, ()):
            self.worked.pop(peer, None)
            self.worked[peer] = None
        while len(self.worked) > WORKED_KEPT:
            del self.worked[next(iter(self.worked))]

    async def load(self) -> None:
        """Take up the lease stored before (a restarted coordinator keeps its order, a standby its predecessor's),
        once. The coordinator calls it before it serves: until then no head is named, and the records a leader
        kept while the seat was empty, sent the moment a standby serves, would be refused (work_outbox.py)."""
        if self._loaded:
            return
        self._loaded = True
        try:
            self.lease = await self.sdht.fetch_lease(self.run_hash)
        except Exception as e:
            log.debug("no earlier lease read: %s", e)
        if self.lease is not None:
            self.revoked = list(self.lease.revoked)
            self._costly = set(self.revoked)  # which of them cost nothing is not in the lease: none is dropped first
            self.rollback = _rollback_of(self.lease)
            log.info("leader lease of a previous coordinator, term %d: %s", self.lease.term, _short(self.lease.order))

    async def run(self) -> None:
        """Keep the lease true until cancelled (a failed round is logged and retried)."""
        await self.load()
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a DHT hiccup must not end the leases
                log.warning("could not update the leader lease (%s: %s); retrying", type(e).__name__, e)
            await asyncio.sleep(self.period)

    async def revoke(self, head: str, why: str, rollback_to: int | None = None, caught: int = 0) -> bool:
        """Take the lease from `head` for good (it is never named again); with `rollback_to`, the new
        lease also orders the swarm back to that snapshot step (`head` was caught at step `caught`).
        True once the new lease is stored."""
        if head not in self.revoked:
            self.revoked.append(head)
            if caught or head in self.worked:  # it led a step (`caught`), or did checked work: it cost something
                self._costly.add(head)
            log.warning("head %s may no longer lead: %s", head[-8:], why)
            if rollback_to is not None:  # numbered by the revocations: one order per revocation, never again
                self.rollback = (max(len(self.revoked), self.rollback[0] + 1), rollback_to, caught, head)
            self._bound_revoked()
        lease = await self.tick()
        if self.on_revoke is not None and lease is not None:
            await self.on_revoke(lease)
        return lease is not None and head not in lease.order

    def _bound_revoked(self) -> None:
        """Keep `revoked` within `MAX_REVOKED`: drop the oldest costless revocation first, a costly one only when
        none is left (more than MAX_REVOKED heads that led or worked, all caught)."""
        while len(self.revoked) > MAX_REVOKED:
            drop = next((p for p in self.revoked if p not in self._costly), self.revoked[0])
            log.info("head %s's revocation is dropped: a lease holds %d at most, and it is the oldest %s", drop[-8:],
                     MAX_REVOKED, "of a head that cost nothing" if drop not in self._costly else "(all cost something)")
            self.revoked.remove(drop)
            self._costly.discard(drop)

    async def tick(self) -> LeaderLease | None:
        """One round: read the heads, re-order, store the lease if it changed or is due."""
        async with self._lock:  # a revocation and the periodic round never interleave
            return await self._tick()

    async def _tick(self) -> LeaderLease | None:
        announced = await self.sdht.stage_peers(self.run_hash, 0)
        self._gone = {p: t for p, t in self._gone.items() if any(a.peer_id == p for a in announced)}
        # a head set aside stays out until it announces again (restarted): its old record outlives it
        heads = [a for a in announced if a.state in LIVE_STATES and a.timestamp > self._gone.get(a.peer_id, -1.0)]
        now = self.clock()
        for a in heads:
            self._first_seen.setdefault(a.peer_id, now)
            self._last_present[a.peer_id] = now
        present = sorted((a.peer_id for a in heads), key=lambda p: (self._first_seen[p], self._tie(p)))
        previous = self.lease.order if self.lease is not None else []
        named = {a.peer_id for a in announced}
        held = [p for p in previous if p not in named and now - self._last_present.get(p, -1e18) < self.absent_grace_s]
        self._first_seen = {p: t for p, t in self._first_seen.items() if p in present or p in held}
        self._last_present = {p: t for p, t in self._last_present.items() if p in present or p in held}
        first = next((p for p in previous if p in present), None)
        if first is not None and self.probe is not None:
            answered = await self.probe(first)
            self._failures = {first: 0 if answered else self._failures.get(first, 0) + 1}
            if self._failures[first] >= self.probe_failures:
                log.info("head %s stopped answering: the next head of the lease leads", first[-8:])
                present.remove(first)
                self._first_seen.pop(first, None)  # if it comes back, it comes back last
                self._last_present.pop(first, None)
                self._gone[first] = max(a.timestamp for a in heads if a.peer_id == first)
        order = next_order(previous, present + held, self.trusted, self.revoked)  # the held are all in `previous`
        if not self.trusted:  # heads that worked first: announcing costs a stranger nothing, work does
            order = [p for p in order if p in self.worked] + [p for p in order if p not in self.worked]
        if (self.lease is None or order != self.lease.order or self.revoked != self.lease.revoked
                or self.rollback != _rollback_of(self.lease)):
            term = max((self.lease.term + 1) if self.lease else 0, int(time.time() * 1000))
            number, to, caught, of = self.rollback
            self.lease = LeaderLease(self.run_hash, term, order, revoked=list(self.revoked), rollback_id=number,
                                     rollback_to=to, rollback_caught=caught, rollback_of=of)
            log.info("leader lease, term %d: %s", term, _short(order) or "no head yet")
            self._stored = float("-inf")
        if now - self._stored >= self.republish_s:
            self.lease.issued = time.time()
            if await self.sdht.publish_lease(self.lease, self.ttl):
                self._stored = now
            else:
                log.warning("the DHT did not store the leader lease; retrying")
        return self.lease


    def _tie(self, peer: str) -> bytes:
        return hashlib.blake2b(peer.encode(), key=self._salt, digest_size=16).digest()


def _rollback_of(lease: LeaderLease) -> tuple[int, int, int, str]:
    return lease.rollback_id, lease.rollback_to, lease.rollback_caught, lease.rollback_of


def _short(order: Sequence[str]) -> str:
    return ", ".join(p[-8:] for p in order)

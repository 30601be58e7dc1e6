"""`Router`: which replica of a stage gets the next microbatch, from the DHT's announcements
and what this peer measured itself. It implements the peer's `PeerDirectory`.

Score of a live replica p (lowest wins):

    score(p) = (in_flight(p) + 1) * rtt(p)

where in_flight counts this peer's requests to p not yet answered and rtt(p) is an EWMA of
p's measured round trips (activation out, its gradient back; decay 0.7). A replica not
measured yet counts as the median of the measured ones (1 s if none): a peer's *claimed*
throughput never steers traffic (it only informs the dashboard).

Near ties are drawn at random: every candidate whose score is within NEAR_TIE (1.25) x the
lowest is equally likely. One sender with several microbatches in flight still spreads them
exactly (each pick raises its replica's in_flight), and independent senders, each with one
microbatch in flight (the replicas of the stage before), no longer all pick the same replica
(the lowest id of a tie, as a deterministic rule did: one replica of a stage did all the work
and the others none). A replica clearly faster than the rest (by more than 1.25x) still takes
an idle sender's microbatch until queueing raises its round trip. The draw comes from this
router's own generator (seeded from its peer id, so a simulation is reproducible).

A round trip is forgotten toward the stage's fastest while it is not measured again:

    rtt'(p) = f + (rtt(p) - f) * 0.5 ** (age(p) / RTT_FORGET_S)      (f: the fastest measured rtt
                                                                      of the candidates; rtt(p) > f)

A replica picked is measured again and keeps what it earned; one that is avoided never would
be: one slow round trip (its first, with the accelerator's warm-up in it, or a pause) made it
look many times slower than it is, and while the others kept fewer microbatches in flight than
that ratio it never got another to show otherwise. Forgotten, it gets one again within a few
half-lives; a replica really that slow is measured so again and avoided again.

Probation (issue 20): a replica is *proven* once it has returned a gradient to this peer. While
a stage has a proven live replica, its unproven ones share one probation slot: at most one
microbatch is in flight to an unproven replica of the stage at a time, so 40 fake ids draw
one microbatch, not 40/41 of them. A probe that fails (a transport failure, or a missed
deadline: `peer/daemon/daemon.py`) closes the stage's probation for

    pause = max(1 s, 40 x t_fail)        (t_fail: how long the failed probe held its microbatch)

so failed probations cost a stage at most about 1/40 of its time, however many fake ids wait.
A stage with no proven live replica (a new swarm) gives every replica work. A replica that
fails is banned for a backoff that doubles with each failure: 5 s, 10 s, 20 s, ... for a
proven one, 12 times that (60 s, 120 s, ...) for one that never returned work here (an id
that never answers is not dialled every few steps), capped at 10 min. With no live replica,
`pick` polls the DHT until a deadline, then raises one clear error.
"""
from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from peer.daemon.interfaces import LinkError, PeerInfo, PeerStatus, RollbackOrder
from swarm import __version__
from swarm.dht import LeaderLease, StageAnnouncement, SwarmDHT

from .run_bans import RunBans

log = logging.getLogger(__name__)

LIVE_STATES = ("online", "paused")  # announced states of replicas that take microbatches and reduce
RTT_DECAY = 0.7
MAX_BAN_S = 600.0
PARDONS_READ_S = 5.0  # a lifted ban holds this long at most after the swarm key's holder lifts it (`swarm unban`)
# the leader lease read `fresh`, and a stage's announcements read `recent` (the leading head's `members`), at most
# twice a second; a stage's announcements read `fresh` (a membership check) reach the DHT every time
FRESH_READ_S = 0.5
BAD_DATA_BAN_S = 300.0  # a peer that sent out-of-band numbers: longer than any step's retries
PROBATION_PAUSE_FACTOR = 40.0  # a failed probe closes its stage's probation for 40x the time it wasted
PROBATION_PAUSE_MIN_S = 1.0
UNPROVEN_BAN_FACTOR = 12.0  # the ban of a replica that never returned work here, in units of a proven one's
NEAR_TIE = 1.25  # scores within this factor of the lowest are drawn at random (independent senders spread)
RTT_FORGET_S = 5.0  # half-life of how far an unrefreshed round trip stands above its stage's fastest


@dataclass
class _Ban:
    until: float
    failures: int
    bad_data: bool = False  # the ban in force is for numbers no honest peer sends (not lifted by `forgive_failure`)


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
    # seconds of a monotonic clock; `swarm bench simulate` runs this router on a virtual one
    clock: Callable[[], float] = time.monotonic
    _cache: dict[int, tuple[float, list[StageAnnouncement]]] = field(default_factory=dict)
    _bans: dict[str, _Ban] = field(default_factory=dict)
    run_bans: RunBans = field(default_factory=RunBans)  # convicted by the leading head, less the swarm key's pardons
    _rtt: dict[str, float] = field(default_factory=dict)
    _rtt_at: dict[str, float] = field(default_factory=dict)  # when each round trip was last measured
    _in_flight: dict[str, int] = field(default_factory=dict)
    _proven: set[str] = field(default_factory=set)  # replicas that returned a gradient to this peer
    _probe: dict[int, tuple[str, float]] = field(default_factory=dict)  # stage -> (unproven peer, since)
    _closed: dict[int, float] = field(default_factory=dict)  # stage -> probation closed until (monotonic)
    last_status: PeerStatus | None = None
    _lease: LeaderLease | None = None
    _lease_read: float = float("-inf")
    _pardons_read: float = float("-inf")
    rng: random.Random | None = None  # draws among near ties; None: seeded from peer_id

    def __post_init__(self) -> None:
        if self.rng is None:
            self.rng = random.Random(self.peer_id)

    # ---------------------------------------------------------------- announcing
    def announcement(self, status: PeerStatus) -> StageAnnouncement:
        return StageAnnouncement(self.peer_id, self.run_hash, status.stage, self.maddrs, float(status.throughput),
                                 int(status.queue), int(status.basis_version), status.state, __version__,
                                 step=int(status.step), leads=bool(status.leads))

    async def announce(self, status: PeerStatus) -> None:
        self.last_status = status
        if not await self.dht.announce(self.announcement(status), self.ttl):
            log.warning("the DHT did not store this peer's announcement; it will retry on the next heartbeat")

    # ---------------------------------------------------------------- reading the directory
    async def announced(self, stage: int, fresh: bool = False, recent: bool = False) -> list[StageAnnouncement]:
        """Every unexpired announcement of `stage` (any state): read at most every `cache_seconds`; `recent`: at
        most `FRESH_READ_S` old; `fresh`: read now. A leading head asks for the members several times a step
        (coverage, the heads' shares, the commit), each a DHT read on the step's critical path (~20 ms a read on
        a loaded machine, and a multi-hop lookup on the internet); announcements themselves are seconds old, so
        a read half a second old loses nothing there (`recent`, `members`). A check of whether a peer that just
        announced itself may send (membership, a joiner's donors) must see it: `fresh`, rate-limited by its
        caller. A failure or a ban clears the cache: a peer that failed is never kept by it."""
        now = self.clock()
        cached = self._cache.get(stage)
        if fresh or cached is None or now - cached[0] > (FRESH_READ_S if recent else self.cache_seconds):
            peers = await self.dht.stage_peers(self.run_hash, stage)
            self._cache[stage] = (now, peers)
            return peers
        return cached[1]

    def _banned(self, peer: str, now: float) -> bool:
        ban = self._bans.get(peer)
        return peer in self.run_bans or ban is not None and ban.until > now

    def ban(self, peer: str, why: str = "") -> None:
        """Convicted by the leading head (peer/checks/spot_checks.py): banned for the run."""
        if self.run_bans.add(peer, why):
            log.warning("peer %s is banned for the run: the leading head convicted it (false or withheld work, or "
                        "slower than the swarm's slowest uplink: peer/checks/spot_checks.py)", peer[-8:])
        self._cache.clear()

    def _revoked(self, peer: str) -> bool:
        """A head the swarm key's lease names as caught feeding other data: banned from the swarm for good."""
        return self._lease is not None and peer in self._lease.revoked

    def is_banned(self, peer: str) -> bool:
        return self._banned(peer, self.clock()) or self._revoked(peer)

    def refuses(self, peer: str) -> bool:
        """Whether this peer's messages are refused here: banned for the run, for bad data while that ban
        lasts, or a head whose lease was revoked. A peer avoided only for failing is not: a missed answer is
        no wrong message, and refusing the messages of a peer that is alive after all (the leader's commands,
        a replica's contribution) left a standby head behind for good once (test_no_coordinator, under load)."""
        ban = self._bans.get(peer)
        return (peer in self.run_bans or self._revoked(peer)
                or ban is not None and ban.bad_data and ban.until > self.clock())

    async def live_peers(self, stage: int, fresh: bool = False, recent: bool = False) -> list[StageAnnouncement]:
        now = self.clock()
        return [a for a in await self.announced(stage, fresh, recent) if a.state in LIVE_STATES
                and not self._banned(a.peer_id, now) and not self._revoked(a.peer_id)]

    async def lease(self, fresh: bool = False) -> LeaderLease | None:
        """The newest lease of the swarm key this router has read (a read at most every `cache_seconds`);
        a lease with a lower term than one already seen is an old one, and ignored."""
        now = self.clock()
        # a fresh read at most twice a second: whoever asks for one (the coordinator's nudge is anyone's to send)
        if now - self._lease_read >= (FRESH_READ_S if fresh else self.cache_seconds):
            self._lease_read = now
            try:
                found = await self.dht.fetch_lease(self.run_hash)
            except Exception as e:  # a DHT hiccup: keep following the lease already read
                log.debug("could not read the leader lease: %s", e)
                found = None
            if found is not None and (self._lease is None or found.term > self._lease.term):
                if self._lease is None or found.order[:1] != self._lease.order[:1]:
                    log.info("leader lease, term %d: %s", found.term, ", ".join(p[-8:] for p in found.order))
                self._lease = found
            await self._read_pardons()
        return self._lease

    async def _read_pardons(self) -> None:
        """The bans the swarm key lifted (`swarm unban`), read with the lease, at most every `PARDONS_READ_S`."""
        if self.clock() - self._pardons_read < PARDONS_READ_S:
            return
        self._pardons_read = self.clock()
        try:
            pardons = await self.dht.fetch_pardons(self.run_hash)
        except Exception as e:  # a DHT hiccup, or no swarm key adopted: the next lease read retries
            log.debug("could not read the pardons: %s", e)
            return
        if pardons is not None and self.run_bans.pardon(pardons.peers):
            self._cache.clear()

    async def lease_order(self, fresh: bool = False) -> list[str] | None:
        if not self.dht.admission.policy.swarm_key:
            return None  # no coordinator key adopted (a bare reader): the rule without a lease
        lease = await self.lease(fresh)
        return list(lease.order) if lease is not None else []

    async def rollback_order(self) -> RollbackOrder | None:
        if await self.lease_order() is None:  # no swarm key: nobody can order a rollback
            return None
        lease = await self.lease()
        if lease is None or not lease.rollback_id:
            return None
        return RollbackOrder(lease.rollback_id, lease.rollback_to, lease.rollback_caught, lease.rollback_of)

    async def members(self, stage: int) -> list[PeerInfo]:
        return [PeerInfo(a.peer_id, a.stage, a.state, a.step, a.throughput, a.leads)
                for a in await self.live_peers(stage, recent=True)]

    # ---------------------------------------------------------------- routing
    def _rtt_estimate(self, peer: str, fastest: float | None = None) -> float:
        if peer in self._rtt:
            rtt = self._rtt[peer]
            if fastest is not None and rtt > fastest:  # forgotten toward the fastest while not measured again
                age = max(0.0, self.clock() - self._rtt_at.get(peer, self.clock()))
                rtt = fastest + (rtt - fastest) * 0.5 ** (age / RTT_FORGET_S)
            return rtt
        return statistics.median(self._rtt.values()) if self._rtt else 1.0

    def score(self, peer: str, fastest: float | None = None) -> float:
        return (self._in_flight.get(peer, 0) + 1) * self._rtt_estimate(peer, fastest)

    def proven(self, peer: str) -> bool:
        return peer in self._proven

    def _on_probation(self, stage: int, live: list[str]) -> list[str]:
        """The replicas of `live` that may take a microbatch now: the proven ones, and while the
        stage's probation slot is free and open, the unproven ones too (all of them when none is proven)."""
        proven = [p for p in live if p in self._proven]
        if not proven or (stage not in self._probe and self._closed.get(stage, 0.0) <= self.clock()):
            return live
        return proven

    async def pick(self, stage: int, exclude: set[str] = frozenset()) -> str:
        deadline = self.clock() + self.pick_timeout
        fresh = False
        while True:
            live = [a.peer_id for a in await self.live_peers(stage, fresh) if a.peer_id not in exclude]
            candidates = self._on_probation(stage, live)
            if candidates:
                fastest = min((self._rtt[p] for p in candidates if p in self._rtt), default=None)
                scores = {p: self.score(p, fastest) for p in sorted(candidates)}
                low = min(scores.values())
                best = self.rng.choice([p for p, v in scores.items() if v <= low * NEAR_TIE])
                self._in_flight[best] = self._in_flight.get(best, 0) + 1
                if best not in self._proven and any(p in self._proven for p in live):
                    self._probe[stage] = (best, self.clock())
                return best
            if self.clock() >= deadline:
                raise LinkError(f"no live peer serves stage {stage} (waited {self.pick_timeout:g} s); "
                                f"start one with `swarm peer --stage {stage} --initial-peers ...`.")
            fresh = True
            await asyncio.sleep(0.25)  # poll interval of the DHT while waiting for a peer to appear

    def _end_probe(self, peer: str, failed: bool) -> None:
        for stage, (probed, since) in list(self._probe.items()):
            if probed == peer:
                del self._probe[stage]
                if failed:
                    pause = max(PROBATION_PAUSE_MIN_S, PROBATION_PAUSE_FACTOR * (self.clock() - since))
                    self._closed[stage] = self.clock() + pause
                    log.info("replica %s failed its probation at stage %d; no other newcomer of the stage gets "
                             "work for %.0f s", peer[-8:], stage, pause)

    def release(self, peer: str, seconds: float | None) -> None:
        self._in_flight[peer] = max(0, self._in_flight.get(peer, 0) - 1)
        self._end_probe(peer, failed=False)
        if seconds is not None:
            self._proven.add(peer)
            old = self._rtt.get(peer)
            self._rtt[peer] = seconds if old is None else RTT_DECAY * old + (1 - RTT_DECAY) * seconds
            self._rtt_at[peer] = self.clock()

    def report_failure(self, peer: str, bad_data: bool = False) -> None:
        self._end_probe(peer, failed=True)
        now = self.clock()
        ban = self._bans.get(peer, _Ban(0, 0))
        if ban.until <= now:  # a burst of failures inside one ban (every microbatch of a step) counts once
            ban.failures += 1
            ban.bad_data = False
        ban.bad_data = ban.bad_data or bad_data
        base = self.base_ban * (1.0 if peer in self._proven else UNPROVEN_BAN_FACTOR)
        seconds = min(MAX_BAN_S, base * 2 ** (ban.failures - 1))
        ban.until = max(ban.until, now + max(seconds, BAD_DATA_BAN_S if bad_data else 0.0))
        self._bans[peer] = ban
        self._cache.clear()
        log.warning("peer %s failed; avoiding it for %.0f s", peer[-8:], ban.until - self.clock())

    def forgive_failure(self, peer: str) -> None:
        """Lift a ban for failing only (its count stays: the next failure doubles the next ban)."""
        ban, now = self._bans.get(peer), self.clock()
        if ban is None or ban.until <= now or ban.bad_data:
            return
        ban.until = now
        self._cache.clear()
        log.info("peer %s is alive after all; no longer avoided", peer[-8:])

    def run_bans_listed(self) -> dict[str, str]:
        """Peers banned for the run -> why, where this peer knows (`RunBans.listed`)."""
        return self.run_bans.listed()

    def banned_peers(self) -> dict[str, int]:
        """Peers this router saw fail -> their failure count, most failures first (for health reports)."""
        return {peer: ban.failures for peer, ban in sorted(self._bans.items(), key=lambda kv: -kv[1].failures)}

    def measured(self) -> dict[str, float]:
        """Measured round trip (s) per peer, for health reports."""
        return dict(self._rtt)

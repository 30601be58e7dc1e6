"""The records the swarm key signs (leases, vouched hashes, pardons, coordinator claims): `SwarmKeyRecords`,
the part of `SwarmDHT` (`store.py`) that writes and reads them.

Writes need the swarm key (only a coordinator holds it). A coordinator that shares its key with standbys
(`swarm coordinator --standby`) signs only while it holds the seat: `seat_fence` (set by
`swarm/coordinator/seat.py`) is asked before every swarm-key write but its own claim, and a write it
refuses raises `SeatLost`. So a coordinator paused past its term and resumed cannot store one more lease,
hash or basis version beside its successor's. Reads take only what the adopted spec's key signed.
"""
from __future__ import annotations

from collections.abc import Callable

from hivemind.utils import get_dht_time

from swarm.trust.identity import Identity
from swarm.trust.keys import fingerprint_of

from .envelope import Envelope
from .records import (
    CoordinatorClaim,
    LeaderLease,
    Pardons,
    RecordError,
    VouchedSnapshots,
    _require,
    coordinator_key,
    lease_key,
    pardons_key,
    snapshots_key,
    states_key,
)

SEAT_GRACE_S = 60.0  # a coordinator admitted by its claim stays admitted this long after the claim lapses


class SeatLost(RuntimeError):
    """This coordinator no longer holds the seat: it must not sign for the swarm (another one does)."""


class SwarmKeyRecords:
    seat_fence: Callable[[], bool] | None = None  # None: no standby shares the key (tests, `swarm admit`)

    def check_seat(self, what: str) -> None:
        """SeatLost unless this writer may sign `what` for the swarm now."""
        if self.seat_fence is not None and not self.seat_fence():
            raise SeatLost(f"this coordinator does not hold the seat (a standby took over, or its term lapsed): "
                           f"it does not sign {what}.")

    # ------------------------------------------------------------------ leader leases
    async def publish_lease(self, lease: LeaderLease, ttl: float) -> bool:
        """Store the swarm key's lease (the coordinator only; swarm/replicas/leases.py)."""
        return await self._store_swarm(lease_key(lease.run_hash), lease.to_record(), ttl,
                                       "the coordinator grants leases")

    async def fetch_lease(self, run_hash: str) -> LeaderLease | None:
        """The lease the adopted spec's coordinator key signed for `run_hash`, or None if there is none: the DHT's;
        with none there (no coordinator renewed it within its life), the newest this node holds, else the newest
        its peers hold (`record_peers`, record_share.py: asked only when the DHT has none and this node holds none).
        Every lease read is held and re-served; a reader keeps the highest term it saw (`Router.lease`)."""
        found = await self._swarm_entry(lease_key(run_hash), LeaderLease, run_hash)
        if found is None and self.held.lease_of(run_hash) is None and self.record_peers is not None:
            found = await self.record_peers.lease(run_hash, self.admission.policy)
        if found is not None:
            self.held.keep_lease(*found)
        return self.held.lease_of(run_hash) if found is None else found[1]

    async def publish_vouched(self, vouched: VouchedSnapshots, ttl: float, states: bool = False) -> bool:
        """Store the snapshot hashes (or with `states`, the state hashes after each step) the swarm key
        vouches for (the coordinator only; swarm/replicas/vouched.py)."""
        key = (states_key if states else snapshots_key)(vouched.run_hash)
        return await self._store_swarm(key, vouched.to_record(), ttl, "the coordinator vouches for snapshots")

    async def fetch_vouched(self, run_hash: str, states: bool = False) -> VouchedSnapshots | None:
        """The snapshot (or state) hashes the adopted spec's coordinator key vouches for (None: none yet)."""
        return await self._swarm_record((states_key if states else snapshots_key)(run_hash), VouchedSnapshots,
                                        run_hash)

    async def publish_pardons(self, pardons: Pardons, ttl: float) -> bool:
        """Store the bans the swarm key lifts (`swarm unban`; only the swarm key's holder)."""
        return await self._store_swarm(pardons_key(pardons.run_hash), pardons.to_record(), ttl,
                                       "the swarm key's holder lifts bans")

    async def fetch_pardons(self, run_hash: str) -> Pardons | None:
        """The bans the adopted spec's coordinator key lifted (None: none)."""
        return await self._swarm_record(pardons_key(run_hash), Pardons, run_hash)

    # ------------------------------------------------------------------ coordinator claims
    async def publish_claim(self, claim: CoordinatorClaim, ttl: float) -> bool:
        """Store this coordinator's claim to the seat (swarm/coordinator/seat.py), under its own subkey."""
        if self.swarm_key is None:
            raise RuntimeError("only a coordinator claims the seat: this SwarmDHT holds no swarm key.")
        subkey = f"{self.swarm_key.fingerprint()}:{claim.peer_id}"
        return await self._store(coordinator_key(claim.run_hash), subkey, claim.to_record(), ttl,
                                 Identity.of_key(self.swarm_key))

    async def fetch_claims(self, run_hash: str, trusted: bytes | None = None) -> list[CoordinatorClaim]:
        """Every unexpired claim to the seat signed by `trusted` (default: the adopted spec's key)."""
        trusted = trusted or self.admission.policy.swarm_key or (
            self.swarm_key.public_bytes() if self.swarm_key is not None else b"")
        if not trusted:
            raise RecordError("no coordinator key to trust claims from; adopt the run spec first.")
        key, out = coordinator_key(run_hash), []
        envelopes, _ = await self.entries(key)
        for env in envelopes:
            try:
                claim = CoordinatorClaim.from_record(env.record())
                _require(env.subkey == f"{fingerprint_of(trusted)}:{claim.peer_id}",
                         f"claim {env.subkey} is not the swarm key's, or names another peer.")
                _require(claim.run_hash == run_hash, "the claim is for another run.")
            except (RecordError, TypeError) as e:
                self._skip(key, str(e))
                continue
            out.append(claim)
        return out

    async def learn_coordinators(self, run_hash: str) -> None:
        """Admit every coordinator whose claim is live (a standby of a private swarm carries no ticket)."""
        try:
            claims = await self.fetch_claims(run_hash)
        except RecordError:
            return
        for claim in claims:
            if claim.until > get_dht_time():
                self.admission.admit_coordinator(claim.peer_id, claim.until + SEAT_GRACE_S)

    # ------------------------------------------------------------------ shared
    async def _store_swarm(self, key: str, record: dict, ttl: float, only: str) -> bool:
        """Store a record of the swarm key's, filed under its fingerprint; `only`: who may (for the error)."""
        if self.swarm_key is None:
            raise RuntimeError(f"only {only}: this SwarmDHT holds no swarm key.")
        self.check_seat(key.rsplit("/", 1)[-1])
        return await self._store(key, self.swarm_key.fingerprint(), record, ttl, Identity.of_key(self.swarm_key))

    async def _swarm_record(self, key: str, cls, run_hash: str):
        """The one record of `cls` under `key` filed by the adopted spec's coordinator key, or None."""
        found = await self._swarm_entry(key, cls, run_hash)
        return found[1] if found is not None else None

    async def _swarm_entry(self, key: str, cls, run_hash: str) -> tuple[Envelope, object] | None:
        """(its envelope, the record) of `_swarm_record`, or None."""
        trusted = self.admission.policy.swarm_key
        if not trusted:
            raise RecordError(f"no coordinator key to trust {key} from; adopt the run spec first.")
        envelopes, _ = await self.entries(key)
        for env in envelopes:
            try:
                _require(env.subkey == fingerprint_of(trusted), f"entry {env.subkey} is not the coordinator's.")
                record = cls.from_record(env.record())
                _require(record.run_hash == run_hash, "the record is for another run.")
            except (RecordError, TypeError) as e:
                self._skip(key, str(e))
                continue
            return env, record
        return None

"""`SwarmDHT`: reads and writes the swarm's records (`records.py`) over a started `hivemind.DHT`.

Every DHT call here is made with `return_future=True` and awaited, so the caller's asyncio
loop never blocks on the DHT process. Writes are sealed in signed envelopes (`envelope.py`):
a peer's own records with its libp2p identity, swarm-wide ones (run spec, basis updates)
with the swarm key. Whatever comes back is checked again (`check_envelope`, then the record
dataclasses), because the node that answered may be hostile; an entry that does not fit is
skipped and counted in `skipped_records`, never trusted.

Once the run spec is read, `adopt(spec)` applies the swarm's rule (its coordinator key; in a
private swarm, tickets; the proof of work each peer id must carry) here and in the DHT node's
validator; `admission` then tells message handlers whom they may serve. A writer in a run that
asks for work sets `work` (`swarm/trust/work.py`) before it writes. `stage_peers` also applies
the run's caps of announcements per network and per block of networks (`network_cap.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable

with warnings.catch_warnings():
    # hivemind's import runs torch.jit.script, which warns that it is deprecated; only that.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    import hivemind
    from hivemind.utils import get_dht_time

from swarm.trust.admission import Admission, AdmissionPolicy, Ticket
from swarm.trust.identity import Identity, ed25519_public_key
from swarm.trust.keys import SigningKey, fingerprint_of
from swarm.trust.work import WorkProof

from .envelope import Envelope, WorkMissing, check_envelope
from .held import HeldRecords
from .network_cap import cap_per_network
from .record_share import PeerRecords
from .records import (
    RUN_KEY,
    RecordError,
    SignedRunSpec,
    StageAnnouncement,
    _require,
    basis_key,
    basis_subkey,
    kind_of,
    parse_basis_subkey,
    stage_key,
)
from .swarm_records import SwarmKeyRecords
from .validator import set_policy

__all__ = ["SwarmDHT"]

log = logging.getLogger(__name__)

ADMISSION_REFRESH_S = 1.0  # `admitted` re-reads the announcements at most this often for an unknown sender
CONNECTIONS_S = 2.0  # how long a read of p2pd's connections serves the network cap
_MAX_REMEMBERED = 4096  # peers whose first sighting, or whose skipped record, this reader remembers


async def _visible_maddrs(_dht: hivemind.DHT, node) -> list[str]:
    # Runs inside the DHT process (via run_coroutine), hence module-level and picklable.
    return [str(m) for m in await node.get_visible_maddrs()]


async def _connected_at(_dht: hivemind.DHT, node) -> dict[str, list[str]]:
    """peer id -> the remote addresses of this node's live libp2p connections to it (p2pd's list)."""
    return {info.peer_id.to_base58(): [str(a) for a in info.addrs] for info in await node.p2p.list_peers()}


def _cap(value: object) -> int:
    """A cap of the run spec (`ids_per_network`, `ids_per_block`): a positive int, else 0 (no cap)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _remember(memory: OrderedDict, key: str, value=None) -> bool:
    """Note `key` (bounded: the least recently noted is forgotten first; a key noted again keeps its first
    value); True if it was new."""
    if key in memory:
        memory.move_to_end(key)  # a peer read on every lookup is not pushed out by a flood of one-off ids
        return False
    memory[key] = value
    if len(memory) > _MAX_REMEMBERED:
        memory.popitem(last=False)
    return True


class SwarmDHT(SwarmKeyRecords):
    """The swarm's records over a started `hivemind.DHT` (not owned: stop it with `stop_dht`).

    `identity` signs this node's own records (None: a reader that writes nothing);
    `swarm_key` signs basis updates (the coordinator only); `ticket` is this peer's admission
    to a private swarm, carried in every record it writes.
    """

    def __init__(self, dht: hivemind.DHT, identity: Identity | None = None, *, swarm_key: SigningKey | None = None,
                 ticket: Ticket | None = None, policy: AdmissionPolicy | None = None) -> None:
        self.dht = dht
        self.identity = identity
        self.swarm_key = swarm_key
        self.ticket = ticket
        self.admission = Admission(policy or AdmissionPolicy.from_ticket(ticket))
        self.skipped_records = 0  # malformed, forged or misfiled entries seen, for health reports
        self.work: WorkProof | None = None  # this writer's proof of work for the adopted run, if it asks for one
        self.ids_per_network = 0  # the run's cap of announcements per stage per /24 or /48 (0: none)
        self.ids_per_block = 0  # ... and per /16 or /32 (0: none)
        self._connected: tuple[float, dict[str, list[str]]] | None = None  # (when read, p2pd's connections)
        self.connections_s = CONNECTIONS_S
        self._run: tuple[str, int] | None = None  # (run hash, stages) once a spec is adopted
        self._first_seen: OrderedDict[str, float] = OrderedDict()  # peer id -> when this reader first read it
        self._logged: OrderedDict[str, None] = OrderedDict()  # peers whose skipped record was logged
        self._refreshed = 0.0
        self._warned_expiry = False
        self.held = HeldRecords()  # the coordinator's records this node read, re-served to peers (record_share.py)
        self.record_peers: PeerRecords | None = None  # who to ask for them when the DHT holds none (None: nobody)

    def _skip(self, where: str, problem: str, peer: str | None = None) -> None:
        """Count a skipped entry; `peer`: log its first skip as a warning (a missing proof, a crowded network)."""
        self.skipped_records += 1
        if peer is not None and _remember(self._logged, peer):
            log.warning("skipped the records of peer %s under %s: %s", peer, where, problem)
        else:
            log.debug("skipped a record under %s: %s", where, problem)

    # ------------------------------------------------------------------ the swarm's rule
    async def adopt(self, spec) -> None:
        """Apply the rule the signed run spec states (a `protocol.spec.RunSpec`): pin its coordinator key for
        swarm-wide records and, if it is private, require tickets. AdmissionError if this node, which
        writes, holds no valid ticket for a private swarm."""
        policy = AdmissionPolicy.for_spec(spec)
        if policy.private and self.identity is not None:
            policy.check(self.identity.peer_id, self.ticket)  # the one clear refusal, before anything is written
        self.admission.adopt(policy)
        self._run = (spec.run_hash, spec.n_stages)
        # absent in older coordinators' specs: no cap (no block cap, for specs from before it)
        self.ids_per_network, self.ids_per_block = (_cap(spec.extra.get(k)) for k in ("ids_per_network",
                                                                                       "ids_per_block"))
        dropped = await set_policy(self.dht, policy)
        if dropped:
            log.info("dropped %d stored records that this swarm's rule refuses", dropped)

    async def admitted(self, peer_id: str) -> bool:
        """May a message from `peer_id` be served? Like `admission.admits`, but an unknown sender of a private
        swarm is first looked up in the stage announcements (which carry its ticket)."""
        if self.admission.knows(peer_id):
            return True
        if self._run is not None and time.monotonic() - self._refreshed >= ADMISSION_REFRESH_S:
            self._refreshed = time.monotonic()
            await self.all_stage_peers(*self._run)
            await self.learn_coordinators(self._run[0])
        return self.admission.admits(peer_id)

    # ------------------------------------------------------------------ signed entries
    def _own_identity(self) -> Identity:
        if self.identity is None:
            raise RuntimeError("this SwarmDHT has no identity, so it can only read; pass the node's Identity.")
        return self.identity

    async def _store(self, key: str, subkey: str, record: object, ttl: float, signer: Identity,
                     ticket: bytes = b"", work: int | None = None) -> bool:
        kind = kind_of(key)
        if kind is None or not 0 < ttl <= kind.max_ttl:
            raise ValueError(f"a record under {key} may live at most {kind.max_ttl if kind else 0:g} s, not {ttl:g}.")
        expiration = get_dht_time() + ttl
        env = Envelope.seal(key, subkey, record, expiration, signer, ticket, work)
        return bool(await self.dht.store(key, env.to_value(), expiration, subkey=subkey, return_future=True))

    async def store_own(self, key: str, record: object, ttl: float) -> bool:
        """Store `record` under this node's peer id for `ttl` seconds, signed (and ticketed in a private swarm)."""
        identity = self._own_identity()
        ticket = self.ticket.to_bytes() if self.ticket is not None else b""
        bits = self.admission.policy.work_bits
        if bits and (self.work is None or self.work.peer_id != identity.peer_id):
            raise RuntimeError(f"this run asks a proof of work of {bits} bits for every peer id and this node holds "
                               f"none: set SwarmDHT.work (swarm.trust.work.proof_for) before it writes.")
        work = self.work.nonce if bits else None  # none asked: records exactly as before
        if (self.admission.policy.private and self.ticket is not None and self.ticket.expires
                and get_dht_time() + ttl > self.ticket.expires and not self._warned_expiry):
            self._warned_expiry = True
            log.warning("this peer's ticket expires at %s: from now on the swarm refuses its records; ask the "
                        "coordinator for a new ticket (`swarm admit`) and restart with it.",
                        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.ticket.expires)))
        return await self._store(key, identity.peer_id, record, ttl, identity, ticket, work)

    async def entries(self, key: str) -> tuple[list[Envelope], list[str]]:
        """The unexpired entries under `key` that pass `check_envelope`, and the problems of those that did not."""
        found = await self.dht.get(key, latest=True, return_future=True)
        if found is None:
            return [], []
        if not isinstance(found.value, dict):
            self._skip(key, "the entry is a plain value, not a map of signed records.")
            return [], ["the entry is a plain value, not a map of signed records."]
        now, valid, problems = get_dht_time(), [], []
        for subkey, item in found.value.items():
            if item.expiration_time <= now:
                continue
            try:
                env = Envelope.from_entry(subkey, item.value, item.expiration_time)
                _require(env.key == key, "the record names another key than the one it is filed under.")
                check_envelope(env, now, self.admission.policy)
            except RecordError as e:
                self._skip(key, str(e), subkey if isinstance(e, WorkMissing) else None)
                problems.append(str(e))
                continue
            valid.append(env)
        return valid, problems

    # ------------------------------------------------------------------ run spec
    async def publish_run_spec(self, spec_json: str, key: SigningKey, ttl: float) -> SignedRunSpec:
        self.check_seat("the run spec")
        record = SignedRunSpec.create(spec_json, key)
        stored = await self._store(RUN_KEY, record.fingerprint, record.to_record(), ttl, Identity.of_key(key))
        if not stored:
            raise RuntimeError("the DHT did not store the run spec (no node answered, or it holds a later one).")
        return record

    async def fetch_run_spec(self, trusted_key: bytes | None = None) -> SignedRunSpec | None:
        """The published run spec, None if there is none; RecordError if none can be trusted."""
        envelopes, problems = await self.entries(RUN_KEY)
        if not envelopes and not problems:
            return None
        valid = []
        for env in envelopes:
            try:
                record = SignedRunSpec.from_record(env.record())
                record.verify()
                _require(ed25519_public_key(env.signer) == record.public_key,
                         "the run spec is signed by one key and filed by another.")
            except RecordError as e:
                self._skip(RUN_KEY, str(e))
                problems.append(str(e))
                continue
            valid.append(record)
        if trusted_key is not None:
            for record in valid:
                if record.public_key == bytes(trusted_key):
                    return record
            if valid:
                valid[0].verify(trusted_key)  # raises with the signer's and the trusted fingerprints
        elif len(valid) == 1:
            return valid[0]
        elif valid:
            keys = ", ".join(sorted(r.fingerprint for r in valid))
            raise RecordError(f"several keys ({keys}) publish a run spec; pin the coordinator's key with trusted_key.")
        raise RecordError(problems[0] if problems else "the DHT holds no run spec signed by the trusted key.")

    # ------------------------------------------------------------------ stage announcements
    async def announce(self, ann: StageAnnouncement, ttl: float) -> bool:
        """Publish this node's `ann` for `ttl` seconds; False if no DHT node stored it."""
        if ann.peer_id != self._own_identity().peer_id:
            raise ValueError(f"a node announces only itself ({self.identity.peer_id}), not {ann.peer_id}.")
        return await self.store_own(stage_key(ann.run_hash, ann.stage), ann.to_record(), ttl)

    async def stage_peers(self, run_hash: str, stage: int) -> list[StageAnnouncement]:
        """Unexpired, well-formed announcements for one stage, each signed by the peer it names, sorted by peer id."""
        key = stage_key(run_hash, stage)
        envelopes, _ = await self.entries(key)
        peers = []
        for env in envelopes:
            try:
                ann = StageAnnouncement.from_record(env.record())
                _require(ann.peer_id == env.subkey, "the announcement is filed under another peer's id.")
                _require((ann.run_hash, ann.stage) == (run_hash, stage), "the announcement is filed under another key.")
            except (RecordError, TypeError) as e:
                self._skip(key, str(e))
                continue
            self.admission.learn(ann.peer_id, env.ticket or None)  # what a handler asks `admits` about
            _remember(self._first_seen, ann.peer_id, time.monotonic())
            peers.append(ann)
        peers.sort(key=lambda a: a.peer_id)
        caps = [c for c in (self.ids_per_network, self.ids_per_block) if c > 0]
        if caps and min(caps) < len(peers):  # else no network or block can be over its cap: no need to ask p2pd
            peers, crowded = cap_per_network(peers, self.ids_per_network, await self._connections(),
                                             self._first_seen, self.ids_per_block)
            for ann in crowded:
                self._skip(key, f"more ids announce this stage from its network or its block than the run counts "
                           f"({self.ids_per_network or 'any'} per /24 or /48, {self.ids_per_block or 'any'} per "
                           f"/16 or /32)", ann.peer_id)
        return peers

    async def _connections(self) -> dict[str, list[str]]:
        """p2pd's live connections (peer id -> remote addresses), read at most every CONNECTIONS_S: fake ids
        crowding a stage must not make every directory read a daemon round trip."""
        now = time.monotonic()
        if self._connected is None or now - self._connected[0] >= self.connections_s:
            self._connected = (now, await self.dht.run_coroutine(_connected_at, return_future=True))
        return self._connected[1]

    async def all_stage_peers(self, run_hash: str, n_stages: int) -> dict[int, list[StageAnnouncement]]:
        found = await asyncio.gather(*(self.stage_peers(run_hash, s) for s in range(n_stages)))
        return dict(enumerate(found))

    async def heartbeat(self, make_announcement: Callable[[], StageAnnouncement], ttl: float, period: float) -> None:
        """Re-announce every `period` seconds until cancelled, so the record outlives us by at most `ttl`."""
        if not 0 < period < ttl:
            raise ValueError(f"the heartbeat period ({period} s) must be positive and shorter than the ttl ({ttl} s).")
        while True:
            try:
                if not await self.announce(make_announcement(), ttl):
                    log.warning("heartbeat: the DHT did not store this announcement; retrying in %g s", period)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a transient DHT failure must not end the heartbeat
                log.warning("heartbeat failed (%s: %s); retrying in %g s", type(e).__name__, e, period)
            await asyncio.sleep(period)

    # ------------------------------------------------------------------ basis updates
    async def publish_basis(self, run_hash: str, version: int, update: bytes, ttl: float) -> bool:
        """Store one signed basis update (bytes of protocol.basis_update.encode_update), filed under the swarm key."""
        if self.swarm_key is None:
            raise RuntimeError("only the coordinator publishes basis updates: this SwarmDHT holds no swarm key.")
        self.check_seat(f"basis version {version}")
        subkey = basis_subkey(version, self.swarm_key.fingerprint())
        return await self._store(basis_key(run_hash), subkey, update, ttl, Identity.of_key(self.swarm_key))

    async def fetch_bases(self, run_hash: str, coordinator_key: bytes | None = None) -> dict[int, bytes]:
        """Every stored basis update by version, filed by the coordinator's key (default: the adopted spec's);
        the reader still checks each update's own signature."""
        trusted = bytes(coordinator_key) if coordinator_key else self.admission.policy.swarm_key
        if not trusted:
            raise RecordError("no coordinator key to trust basis updates from; adopt the run spec first.")
        key, out = basis_key(run_hash), {}
        envelopes, _ = await self.entries(key)
        for env in envelopes:
            version, signer = parse_basis_subkey(env.subkey)  # check_envelope made sure it parses
            try:
                body = env.record()
                _require(signer == fingerprint_of(trusted), f"basis entry {env.subkey} is not the coordinator's.")
                _require(isinstance(body, bytes), f"basis entry {env.subkey} does not hold update bytes.")
            except RecordError as e:
                self._skip(key, str(e))
                continue
            out[version] = body
        return out

    async def visible_maddrs(self) -> list[str]:
        return await self.dht.run_coroutine(_visible_maddrs, return_future=True)


"""`BasisSync`: a peer's side of the basis updates, over the DHT and the transport.

It checks the coordinator's signature (the key named in the signed run spec), sends this
stage's re-fit statistic to the coordinator, pulls updates from the DHT (the push may have
been missed), and at start-up brings a peer that joins late or restarts onto the current
basis before it serves. If the coordinator is unreachable, training simply continues on the
current basis. The updates it reads are held and re-served (swarm/dht/record_share.py): with every coordinator
down longer than they live in the DHT, a newcomer gets the chain from its peers.
"""
from __future__ import annotations

import logging

import msgpack
import torch

from peer.daemon.daemon import StageDaemon
from protocol.basis_update import BasisUpdate, StatsMessage, canonical_basis, decode_update, encode_stats
from protocol.model import compute_dtype, spec_basis
from protocol.spec import RunSpec
from protocol.wire import KIND_ERROR, KIND_STATS, KIND_WORK, WireError
from swarm.dht import ActiveCoordinator, SwarmDHT
from swarm.net.transport import Transport, TransportError
from swarm.trust.keys import verify

log = logging.getLogger(__name__)

FIRST_TRY_S = 15.0  # the seat's holder as last read (it may be paused, a standby taking over): then read again


class BasisSync:
    def __init__(self, spec: RunSpec, sdht: SwarmDHT, transport: Transport) -> None:
        self.spec, self.sdht, self.transport = spec, sdht, transport
        self.public_key = bytes.fromhex(spec.coordinator_key) if spec.coordinator_key else b""
        self.coordinator = ActiveCoordinator(sdht, spec.run_hash, spec.extra.get("coordinator_peer", ""))
        self._unreachable: set[str] = set()  # coordinators said to be unreachable, until one answers again
        self._stats_lost = False  # the last statistic reached no coordinator
        self.daemon: StageDaemon | None = None
        self._checked_updates: dict[int, tuple[bytes, BasisUpdate]] = {}  # version -> (bytes, update) that passed

    async def updates_come(self) -> bool:
        """Whether a basis update can still come: not while every coordinator's claim to the seat has lapsed."""
        return not await self.coordinator.lapsed()

    def verify(self, update: BasisUpdate) -> bool:
        return bool(self.public_key) and update.run == self.spec.run_hash and \
            verify(self.public_key, update.signing_bytes(), update.signature)

    async def send_stats(self, stats: StatsMessage) -> None:
        lost = await self.to_coordinator(KIND_STATS, encode_stats(stats), "this stage's statistic") is None
        if lost and not self._stats_lost:  # said once an outage: the statistic goes every basis interval
            log.warning("no coordinator reached: training continues on the current basis")
        self._stats_lost = lost

    async def send_work(self, record: bytes) -> bool:
        """The leading head's signed `WorkRecord` (who may vote in a re-fit, snapshot and state hashes, a rollback);
        True if a coordinator answered it (took it or refused it), False if none was reached (the head keeps it:
        swarm/replicas/work_outbox.py)."""
        return await self.to_coordinator(KIND_WORK, record, "this head's work record") is not None

    async def to_coordinator(self, kind: int, body: bytes, what: str, timeout: float = 30.0) -> bytes | None:
        """Send `body` to the active coordinator (the seat's holder: swarm/dht/seat_reader.py); a standby's
        refusal sends it once more to the holder read afresh. Its reply, or None (no coordinator reached)."""
        for attempt in range(2):
            coordinator = await self.coordinator.peer_id() if attempt == 0 else (
                c.peer_id if (c := await self.coordinator.refresh(force=True)) else "")
            if not coordinator:
                return None
            try:
                # a paused holder must not keep the statistic from its successor for long
                reply = await self.transport.request(coordinator, kind, body,
                                                     timeout=min(timeout, FIRST_TRY_S) if attempt == 0 else timeout)
            except TransportError as e:
                # once per coordinator: a head tries it every step while its claim lives on in the DHT
                level = logging.DEBUG if coordinator in self._unreachable else logging.WARNING
                log.log(level, "coordinator %s unreachable (%s)", coordinator[-8:], e)
                self._unreachable.add(coordinator)
                if attempt == 0:
                    continue
                return None
            self._unreachable.discard(coordinator)
            if not _standing_by(reply):
                if reply != b"":
                    log.warning("the coordinator refused %s", what)
                return reply
        return None

    def _checked(self, version: int, body: bytes) -> BasisUpdate | None:
        """The update in `body` if it is the coordinator key's signed update of `version`, else None (the same bytes
        are checked once: a head polls them every 0.1 s at a switch step)."""
        known = self._checked_updates.get(version)
        if known is not None and known[0] == body:
            return known[1]
        try:
            update = decode_update(body, self.spec)
        except WireError as e:
            log.debug("skipped basis entry %s: %s", version, e)
            return None
        if update.version != version or not self.verify(update):
            return None
        self._checked_updates[version] = (body, update)
        return update

    async def _verified_updates(self) -> list[BasisUpdate]:
        """The coordinator's signed updates, by version: the DHT's; with none there (no coordinator has
        republished them within their life), the ones this peer holds, and with none held, those the peers it
        reaches hold (`SwarmDHT.record_peers`, swarm/dht/record_share.py). What passes is held, and re-served."""
        if not self.public_key:
            return []
        stored = await self.sdht.fetch_bases(self.spec.run_hash, self.public_key)
        if not stored:
            stored = dict(self.sdht.held.bases)
        peers = self.sdht.record_peers
        if not stored and peers is not None and self.spec.refits_basis:
            stored = await peers.bases(self.spec.run_hash, lambda v, b: self._checked(v, b) is not None)
        good = {v: (body, u) for v, body in sorted(stored.items()) if (u := self._checked(v, body)) is not None}
        self.sdht.held.keep_bases({v: body for v, (body, _) in good.items()})
        return [u for _, u in good.values()]

    async def pull(self) -> None:
        """Offer the daemon the next version from the DHT, if there is one it does not have yet."""
        daemon = self.daemon
        if daemon is None or daemon.runner.basis is None:
            return
        want = daemon.runner.basis_version + 1
        for update in await self._verified_updates():
            if update.version == want and daemon.runner.scheduled is None:
                problem = await daemon.accept_update(update)
                if problem:
                    log.debug("basis update %d not taken: %s", update.version, problem)

    async def verify_state(self, state: dict) -> str | None:
        """Why a downloaded stage state cannot be trusted, or None: its basis must be the one the
        coordinator signed for its version (version 0: the one every peer generates from the seed)."""
        if self.spec.codec != "subspace":
            return None
        version, U = int(state.get("basis_version", -1)), state.get("U")
        if not isinstance(U, torch.Tensor) or version < 0:
            return "it carries no basis."
        if version == 0:
            want = spec_basis(self.spec).U
        else:
            found = [u for u in await self._verified_updates() if u.version == version]
            if not found:
                return f"its basis version {version} is not one the coordinator signed."
            want = canonical_basis(found[0].U, compute_dtype(self.spec))
        if U.shape != want.shape or not torch.equal(U.to(want.dtype), want):
            return f"its basis is not the signed basis of version {version}."
        return None

    async def catch_up(self, daemon: StageDaemon) -> None:
        """Before serving: apply every update whose step has passed, schedule the next one."""
        runner = daemon.runner
        if runner.basis is None:
            return
        for update in await self._verified_updates():
            if update.version != runner.basis_version + 1:
                continue
            if update.effective_step <= runner.step:
                truncated = runner.catch_up_basis(update.U, update.version, update.effective_step)
                log.info("caught up to basis version %d (truncated %.2e)", update.version, truncated)
            else:
                await daemon.accept_update(update)
                break


def _standing_by(reply: bytes) -> bool:
    """Whether `reply` is a standby coordinator's refusal (swarm/coordinator/duties.py: an error of code
    "standby"); read as plain msgpack, since an error reply carries no tensor for the stage's limits to check."""
    if not reply or len(reply) > 4096:
        return False
    try:
        msg = msgpack.unpackb(reply, raw=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return False
    return isinstance(msg, dict) and msg.get("k") == KIND_ERROR and msg.get("o") == "standby"

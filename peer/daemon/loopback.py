"""In-memory stand-ins for the network, so the daemon's behaviour is tested in one process.

`LoopbackNetwork` delivers request bodies to handlers directly (still as bytes, so every
message goes through wire.py) and counts them; its directory picks, among a stage's online
peers, the one with the fewest requests in flight (ties: lowest peer id), as the real router
does when round trips are equal. Peers in `down` neither answer nor appear. Nothing here is
used in production.

`MemoryKeys` is the in-memory swarm's identities: a real Ed25519 key per peer name, made on first
use, so boundary messages are signed and checked here as over libp2p (protocol/boundary_sig.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .interfaces import Handler, LinkError, PeerInfo, PeerStatus, RollbackOrder


@dataclass
class MemoryKeys:
    """Every peer name's Ed25519 key (the in-memory stand-in for peer id -> public key)."""

    keys: dict[str, Ed25519PrivateKey] = field(default_factory=dict)

    def key(self, peer_id: str) -> Ed25519PrivateKey:
        return self.keys.setdefault(peer_id, Ed25519PrivateKey.generate())

    def signer(self, peer_id: str) -> MemorySigner:
        return MemorySigner(self, peer_id)


@dataclass(frozen=True)
class MemorySigner:
    """`Signer` (peer/daemon/interfaces.py) of one peer name: signs with its key, checks any name's."""

    book: MemoryKeys
    peer_id: str

    def sign(self, data: bytes) -> bytes:
        return self.book.key(self.peer_id).sign(bytes(data))

    def verify(self, peer_id: str, data: bytes, signature: bytes) -> bool:
        key = self.book.keys.get(peer_id)  # a name that never signed has no key: nothing of it verifies
        if key is None or not isinstance(signature, bytes) or len(signature) != 64:
            return False
        try:
            key.public_key().verify(signature, bytes(data))
        except (InvalidSignature, ValueError, TypeError):
            return False
        return True


@dataclass
class LoopbackNetwork:
    handlers: dict[tuple[str, str], Handler] = field(default_factory=dict)
    status: dict[str, PeerStatus] = field(default_factory=dict)
    bytes_sent: dict[str, int] = field(default_factory=dict)  # kind -> request bytes
    down: set[str] = field(default_factory=set)
    inflight: dict[str, int] = field(default_factory=dict)
    lease: list[str] | None = None  # the heads that may lead, in order, as a coordinator's lease would say
    rollback: RollbackOrder | None = None  # the rollback that lease would order
    keys: MemoryKeys = field(default_factory=MemoryKeys)  # every peer's identity key

    def link(self, peer_id: str) -> LoopbackLink:
        return LoopbackLink(self, peer_id)

    def directory(self, peer_id: str) -> LoopbackDirectory:
        return LoopbackDirectory(self, peer_id)

    def kill(self, peer_id: str) -> None:
        """The peer vanishes: no answers, no announcement."""
        self.down.add(peer_id)
        self.status.pop(peer_id, None)


@dataclass
class LoopbackLink:
    net: LoopbackNetwork
    peer_id: str

    @property
    def signer(self) -> MemorySigner:
        return self.net.keys.signer(self.peer_id)

    async def serve(self, kind: str, handler: Handler) -> None:
        self.net.handlers[(self.peer_id, kind)] = handler

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        handler = self.net.handlers.get((peer, kind))
        if handler is None or peer in self.net.down or self.peer_id in self.net.down:
            raise LinkError(f"peer {peer} does not serve '{kind}'.")
        self.net.bytes_sent[kind] = self.net.bytes_sent.get(kind, 0) + len(body)
        return await handler(bytes(body), self.peer_id)


@dataclass
class LoopbackDirectory:
    net: LoopbackNetwork
    peer_id: str
    banned: set[str] = field(default_factory=set)

    async def announce(self, status: PeerStatus) -> None:
        if self.peer_id not in self.net.down:
            self.net.status[self.peer_id] = status

    async def pick(self, stage: int, exclude: set[str] = frozenset()) -> str:
        live = [p.peer_id for p in await self.members(stage) if p.peer_id not in exclude]
        if not live:
            raise LinkError(f"no peer serves stage {stage}.")
        best = min(live, key=lambda p: (self.net.inflight.get(p, 0), p))
        self.net.inflight[best] = self.net.inflight.get(best, 0) + 1
        return best

    def release(self, peer: str, seconds: float | None) -> None:
        self.net.inflight[peer] = max(0, self.net.inflight.get(peer, 0) - 1)

    def report_failure(self, peer: str, bad_data: bool = False) -> None:
        pass

    def forgive_failure(self, peer: str) -> None:
        pass

    def ban(self, peer: str, why: str = "") -> None:
        self.banned.add(peer)

    def is_banned(self, peer: str) -> bool:
        return peer in self.banned

    def refuses(self, peer: str) -> bool:
        return peer in self.banned

    async def lease_order(self, fresh: bool = False) -> list[str] | None:
        return None if self.net.lease is None else list(self.net.lease)

    async def rollback_order(self) -> RollbackOrder | None:
        return self.net.rollback

    async def members(self, stage: int) -> list[PeerInfo]:
        return sorted((PeerInfo(p, st.stage, st.state, st.step, st.throughput, st.leads)
                       for p, st in self.net.status.items()
                       if st.stage == stage and st.state in ("online", "paused") and p not in self.net.down
                       and p not in self.banned),
                      key=lambda i: i.peer_id)

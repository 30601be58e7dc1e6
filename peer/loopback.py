"""In-memory stand-ins for the network, so the daemon's behaviour is tested in one process.

`LoopbackNetwork` delivers request bodies to handlers directly (still as bytes, so every
message goes through wire.py) and counts them; its directory picks the first registered
peer of a stage. Nothing here is used in production.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .interfaces import Handler, LinkError, PeerStatus


@dataclass
class LoopbackNetwork:
    handlers: dict[tuple[str, str], Handler] = field(default_factory=dict)
    status: dict[str, PeerStatus] = field(default_factory=dict)
    bytes_sent: dict[str, int] = field(default_factory=dict)  # kind -> request bytes
    down: set[str] = field(default_factory=set)

    def link(self, peer_id: str) -> LoopbackLink:
        return LoopbackLink(self, peer_id)

    def directory(self, peer_id: str) -> LoopbackDirectory:
        return LoopbackDirectory(self, peer_id)


@dataclass
class LoopbackLink:
    net: LoopbackNetwork
    peer_id: str

    async def serve(self, kind: str, handler: Handler) -> None:
        self.net.handlers[(self.peer_id, kind)] = handler

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        handler = self.net.handlers.get((peer, kind))
        if handler is None or peer in self.net.down:
            raise LinkError(f"peer {peer} does not serve '{kind}'.")
        self.net.bytes_sent[kind] = self.net.bytes_sent.get(kind, 0) + len(body)
        return await handler(bytes(body), self.peer_id)


@dataclass
class LoopbackDirectory:
    net: LoopbackNetwork
    peer_id: str

    async def announce(self, status: PeerStatus) -> None:
        self.net.status[self.peer_id] = status

    async def pick(self, stage: int, exclude: set[str] = frozenset()) -> str:
        for peer, st in self.net.status.items():
            if st.stage == stage and st.state == "online" and peer not in exclude and peer not in self.net.down:
                return peer
        raise LinkError(f"no peer serves stage {stage}.")

    def report_failure(self, peer: str) -> None:
        pass

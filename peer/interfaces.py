"""The two small interfaces a peer is handed: something that moves messages, and something
that finds and announces peers. `swarm/` implements both over hivemind; `peer/loopback.py`
implements them in memory for fast tests. The daemon knows nothing else of the network.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

Handler = Callable[[bytes, str], Awaitable[bytes]]  # (request body, sender peer id) -> reply body


class LinkError(RuntimeError):
    """A message could not be delivered (timeout, connection, or the remote refused the frame)."""


class MessageLink(Protocol):
    peer_id: str

    async def serve(self, kind: str, handler: Handler) -> None: ...

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes: ...


@dataclass
class PeerStatus:
    """What a peer says of itself in its announcement (refreshed by heartbeat)."""

    stage: int
    state: str = "joining"  # joining | online | leaving
    throughput: float = 0.0  # tokens/s over the last steps
    queue: int = 0
    basis_version: int = 0
    step: int = 0
    extra: dict = field(default_factory=dict)


class PeerDirectory(Protocol):
    async def announce(self, status: PeerStatus) -> None: ...

    async def pick(self, stage: int, exclude: set[str] = ...) -> str:
        """A live peer serving `stage`, best first; raises LinkError if none appears in time."""
        ...

    def report_failure(self, peer: str) -> None:
        """Tell the router a peer failed, so it is avoided for a while."""
        ...

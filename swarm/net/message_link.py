"""`LinkAdapter`: a peer's `MessageLink` (peer/daemon/interfaces.py) over our `Transport`, for its stage daemon
and for anything else that downloads a stage's state as a replica would (`swarm export` from live peers)."""
from __future__ import annotations

from peer.daemon.interfaces import LinkError, Signer

from .transport import Transport, TransportError


class LinkAdapter:
    """The daemon's MessageLink over our Transport: transport failures become LinkError. `signer`: the peer's
    identity, which signs its boundary messages (swarm/trust/boundary_signer.py; None: unsigned)."""

    def __init__(self, transport: Transport, peer_id: str, signer: Signer | None = None) -> None:
        self.transport, self.peer_id, self.signer = transport, peer_id, signer
        self.limits: dict[str, int] = {}  # kind -> the largest request this peer accepts

    async def serve(self, kind, handler) -> None:
        await self.transport.serve(kind, handler, max_bytes=self.limits.get(kind))

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        try:
            return await self.transport.request(peer, kind, body, timeout)
        except TransportError as e:
            raise LinkError(str(e)) from e

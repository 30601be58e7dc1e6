"""The direct channel's side of a `Transport` (swarm/net/transport.py): enabling it, choosing it for a large
frame, and what its server (swarm/net/direct.py `DirectServer`) needs from the transport.

Mixed into `Transport`, whose counters, shaper, handlers and send order these use; kept apart so that the
libp2p route reads on its own.
"""
from __future__ import annotations

import asyncio
import logging

from .direct import KIND_DIRECT, DirectConnection, DirectDialer, DirectRefused, DirectServer, dial_hosts
from .framing import DIRECT_MIN_BYTES, TransportError, short_text
from .send_order import Turn

__all__ = ["DirectRoute"]

log = logging.getLogger("swarm.net.transport")


class DirectRoute:
    """`Transport`'s direct route; `_dialer` is None until `enable_direct`."""

    _dialer: DirectDialer | None
    _direct: DirectServer | None
    direct_min_bytes: int

    # ----- what the direct channel's server uses (swarm/net/direct.py `FrameHost`)
    def request_limit(self, kind: str) -> int | None:
        return self._limits.get(kind, self.max_frame_bytes) if kind in self._handlers else None

    def count(self, peer: str, kind: str, direction: str, nbytes: int) -> None:
        self._count(peer, kind, direction, nbytes)

    async def arrived(self, nbytes: int, kind: str = "", peer: str = "") -> None:
        await self._shaped_arrival(nbytes, kind, peer)

    async def shaped_write(self, writer: asyncio.StreamWriter, frame: tuple[bytes, ...]) -> None:
        await self._shaped_write(writer, frame)

    async def enable_direct(self, listen: str = "0.0.0.0", port: int = 0, min_bytes: int = DIRECT_MIN_BYTES,
                            serve: bool = True, announced: list[str] | None = None) -> int:
        """Carry frames of at least `min_bytes` over a direct TCP channel where the other peer can be dialed
        (swarm/net/direct.py), and, with `serve`, let others do the same to this peer at `listen`:`port` (0: any
        free port). Tickets name the IP addresses of `announced` (the multiaddrs this peer announces to the
        swarm; default: every visible one), so a peer hands out no address it does not announce anyway.
        Returns the port (0 without `serve`)."""
        self._dialer = DirectDialer(lambda peer: self.request(peer, KIND_DIRECT, b"", timeout=10.0))
        self.direct_min_bytes = min_bytes
        if not serve:
            return 0
        if announced is None:
            announced = [str(m) for m in await self.p2p.get_visible_maddrs()]
        hosts = [listen] if listen not in ("0.0.0.0", "::", "") else dial_hosts(announced)
        self._direct = DirectServer(self, listen, port)
        await self._direct.start()

        async def ticket(_body: bytes, peer: str) -> bytes:
            return self._direct.ticket(peer, hosts).to_bytes()

        await self.serve(KIND_DIRECT, ticket, max_bytes=64)
        log.info("direct channel: frames of %d bytes and more go over TCP port %d where peers can be dialed (%s)",
                 min_bytes, self._direct.port, ", ".join(hosts) or "no address")
        return self._direct.port

    async def direct_ready(self, peer: str) -> bool:
        """Find out now (rather than in the background) whether frames to `peer` can go direct."""
        return self._dialer is not None and await self._dialer.probe(peer)

    async def _direct_connection(self, peer: str, kind: str, nbytes: int) -> DirectConnection | None:
        """A direct connection for this request, or None where libp2p carries it."""
        if self._dialer is None or nbytes < self.direct_min_bytes or kind == KIND_DIRECT:
            return None
        try:
            return await self._dialer.connection(peer)
        except DirectRefused:
            return None

    async def _read_direct_reply(self, conn: DirectConnection, peer: str, kind: str) -> bytes:
        def fail(message: str, reason: str = "protocol") -> TransportError:
            return TransportError(message, kind=kind, peer=peer, reason=reason)

        try:
            status, reply, nbytes = await conn.read_reply(self.max_frame_bytes)
        except asyncio.IncompleteReadError:
            raise fail(f"{peer} closed the direct '{kind}' connection without replying.", "connection") from None
        except (ConnectionError, OSError) as e:
            raise fail(f"the direct connection to {peer} broke while waiting for a '{kind}' reply: {short_text(e)}.",
                       "connection") from e
        except ValueError as e:
            raise fail(f"{peer} sent a bad direct '{kind}' reply: {e}.") from None
        self._count(peer, kind, "in", nbytes)
        await self._shaped_arrival(nbytes, kind, peer)
        return self._reply_body(status, reply, peer, kind)

    async def _direct_exchange(self, conn: DirectConnection, peer: str, kind: str, body: bytes,
                               turn: Turn | None) -> bytes:
        try:
            reply = await self._send_then_read(peer, kind, conn.writer, conn.request_frame(kind, body), turn,
                                               lambda: self._read_direct_reply(conn, peer, kind), direct=True)
        except BaseException as e:
            if isinstance(e, TransportError) and e.reason == "remote":
                self._dialer.give_back(peer, conn)  # a whole, genuine refusal: the connection is fine
            else:
                conn.close()
                self._dialer.broken(peer)
            raise
        self._dialer.give_back(peer, conn)
        return reply

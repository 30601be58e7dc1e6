"""A direct TCP channel beside libp2p for a peer's large frames, where the receiver can be dialed.

Why: `swarm bench transport` measured a libp2p stream between two p2pd daemons at 0.3 of a raw
socket's rate at 1-4 MB frames (docs/benchmarks.md, "Transport"), the ceiling of dense and replica
sums between peers on fast links. This channel carries the same request/reply frames over one plain
TCP connection per request in flight, so Python's streams, not the daemons, set the rate.

Trust comes from libp2p: the receiver hands out a ticket over its authenticated libp2p stream
(kind `direct`), a 16-byte token and a 32-byte key bound to the libp2p peer id that asked. The token
opens a TCP connection; the key never crosses it. Every frame carries a keyed BLAKE3 tag over the
connection's nonce (chosen by the receiver), the frame's sequence number on that connection, its
direction, header and body, so nobody without the key can forge, alter, replay or reorder a frame,
and the receiver knows which peer sent it as surely as over libp2p. The channel is not encrypted:
what crosses it (activations, gradients and sums of an open run) is not secret.

Wire (integers big-endian):

    hello    client -> server: b"SSD1" + token (16)       server -> client: nonce (16)
    request  kind length (1) + kind + body length (4) + body + tag (32)
    reply    status (1) + body length (4) + body + tag (32)
    tag      blake3(key = key, nonce + seq (8) + b"q" or b"r" + header + body)

A peer not dialed yet is found out in the background while its frames go over libp2p; one that cannot
be dialed at any address its ticket names (behind NAT, a firewall) is left to libp2p for `retry_after_s`.
A connection that breaks mid-request is a `TransportError`, as a broken libp2p stream is (the request may
have been delivered; callers already handle that), and the next frame finds the peer out again.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import os
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import blake3
import msgpack

from .addresses import is_circuit, scope_of

__all__ = ["DirectServer", "DirectDialer", "DirectConnection", "DirectRefused", "Ticket", "KIND_DIRECT", "TAG_BYTES",
           "dial_hosts", "direct_framing"]

log = logging.getLogger(__name__)

KIND_DIRECT = "direct"  # the libp2p kind that hands out tickets
MAGIC = b"SSD1"
TOKEN_BYTES, KEY_BYTES, NONCE_BYTES, TAG_BYTES = 16, 32, 16, 32
_KIND_LEN = struct.Struct(">B")
_LENGTH = struct.Struct(">I")
_REPLY = struct.Struct(">BI")
_SEQ = struct.Struct(">Q")
HELLO_TIMEOUT_S = 5.0
MAX_HOSTS = 4
MAX_TICKET_BYTES = 512
CONNECTIONS_PER_TICKET = 16  # a client pools 4 a peer; more is a peer holding sockets open against us


class DirectRefused(Exception):
    """The direct channel could not carry this request before any of it was sent: use libp2p."""


def direct_framing(kind: str) -> int:
    """Bytes the direct channel adds to a request of `kind` and its reply, beyond their bodies: the request's
    kind and length header, the reply's 5-byte header and the two tags (against libp2p's 4 + 5)."""
    return 1 + len(kind.encode()) + _LENGTH.size + TAG_BYTES + _REPLY.size + TAG_BYTES


def dial_hosts(maddrs: list[str]) -> list[str]:
    """The IP addresses of a peer's visible multiaddrs that another peer may dial, widest scope first (a peer
    elsewhere tries its public address before its LAN one, and 127.0.0.1 last), at most MAX_HOSTS."""
    found: dict[str, int] = {}
    for m in maddrs:
        parts = [p for p in m.split("/") if p]
        if is_circuit(m) or len(parts) < 2 or parts[0] not in ("ip4", "ip6") or parts[1] in ("0.0.0.0", "::"):
            continue
        found.setdefault(parts[1], scope_of(m))
    return sorted(found, key=lambda h: -found[h])[:MAX_HOSTS]


def tag(key: bytes, nonce: bytes, seq: int, direction: bytes, header: bytes, body: bytes) -> bytes:
    h = blake3.blake3(key=key)
    for part in (nonce, _SEQ.pack(seq), direction, header, body):
        h.update(part)
    return h.digest(TAG_BYTES)


@dataclass
class Ticket:
    """What the receiver hands one peer over libp2p: where to dial and the secrets of the channel."""

    token: bytes
    key: bytes
    port: int
    hosts: list[str]
    peer: str = ""
    expires: float = 0.0

    def to_bytes(self) -> bytes:
        return msgpack.packb({"t": self.token, "k": self.key, "p": self.port, "h": self.hosts[:MAX_HOSTS]})

    @classmethod
    def from_bytes(cls, data: bytes) -> Ticket:
        if len(data) > MAX_TICKET_BYTES:  # a peer's reply: bounded before it is parsed
            raise ValueError(f"a direct ticket of {len(data)} bytes")
        d = msgpack.unpackb(data)
        token, key, port, hosts = d["t"], d["k"], int(d["p"]), [str(h) for h in d["h"]][:MAX_HOSTS]
        if len(token) != TOKEN_BYTES or len(key) != KEY_BYTES or not 0 < port < 65536:
            raise ValueError("a direct ticket with a bad token, key or port")
        return cls(bytes(token), bytes(key), port, hosts)


class FrameHost(Protocol):
    """What the server needs from the transport it serves beside (swarm/net/direct_route.py implements it)."""

    def request_limit(self, kind: str) -> int | None: ...  # None: the kind is not served
    async def answer(self, kind: str, peer: str, body: bytes) -> tuple[int, bytes]: ...
    def count(self, peer: str, kind: str, direction: str, nbytes: int) -> None: ...
    async def arrived(self, nbytes: int, kind: str = "", peer: str = "") -> None: ...
    async def shaped_write(self, writer: asyncio.StreamWriter, frame: tuple[bytes, ...]) -> None: ...


@dataclass
class DirectServer:
    """Accepts direct connections and answers their requests with the transport's handlers."""

    host: FrameHost
    listen: str = "0.0.0.0"
    port: int = 0
    ticket_ttl_s: float = 3600.0
    _tickets: dict[bytes, Ticket] = field(default_factory=dict)
    _by_peer: dict[str, bytes] = field(default_factory=dict)
    _server: asyncio.AbstractServer | None = None
    _tasks: set = field(default_factory=set)
    _open: dict[bytes, int] = field(default_factory=dict)  # token -> connections open with it

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._on_connection, self.listen, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def ticket(self, peer: str, hosts: list[str]) -> Ticket:
        """A fresh ticket for `peer` (authenticated by libp2p); it replaces that peer's earlier one."""
        old = self._by_peer.pop(peer, None)
        if old is not None:
            self._tickets.pop(old, None)
        now = time.monotonic()
        for token in [t for t, k in self._tickets.items() if k.expires < now]:
            self._by_peer.pop(self._tickets.pop(token).peer, None)
        t = Ticket(os.urandom(TOKEN_BYTES), os.urandom(KEY_BYTES), self.port, hosts, peer, now + self.ticket_ttl_s)
        self._tickets[t.token] = t
        self._by_peer[peer] = t.token
        return t

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        opened = None
        try:
            hello = await asyncio.wait_for(reader.readexactly(len(MAGIC) + TOKEN_BYTES), HELLO_TIMEOUT_S)
            ticket = self._tickets.get(hello[len(MAGIC):]) if hello[:len(MAGIC)] == MAGIC else None
            if ticket is None or ticket.expires < time.monotonic():
                log.debug("closed a direct connection with an unknown ticket")
                return
            if self._open.get(ticket.token, 0) >= CONNECTIONS_PER_TICKET:
                log.warning("closed a direct connection from %s: it already holds %d", ticket.peer,
                            CONNECTIONS_PER_TICKET)
                return
            self._open[ticket.token] = self._open.get(ticket.token, 0) + 1
            opened = ticket.token
            nonce = os.urandom(NONCE_BYTES)
            writer.write(nonce)
            await writer.drain()
            seq = 0
            while await self._answer_one(reader, writer, ticket, nonce, seq):
                seq += 1
        except (asyncio.IncompleteReadError, ConnectionError, OSError, TimeoutError):
            pass  # the client went away or never said hello
        except asyncio.CancelledError:
            pass
        except Exception as e:  # a hostile or broken connection must never take the serving peer down
            log.warning("dropped a direct connection: %s: %s", type(e).__name__, str(e)[:200])
        finally:
            writer.close()
            self._tasks.discard(task)
            if opened is not None:
                self._open[opened] -= 1
                if not self._open[opened]:
                    del self._open[opened]

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ticket: Ticket,
                          nonce: bytes, seq: int) -> bool:
        try:
            (n,) = _KIND_LEN.unpack(await reader.readexactly(1))
        except asyncio.IncompleteReadError:
            return False  # the client closed an idle connection
        kind_bytes = await reader.readexactly(n)
        (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
        kind, peer = kind_bytes.decode("utf-8", errors="replace"), ticket.peer
        limit = self.host.request_limit(kind)
        if limit is None or length > limit:
            log.warning("closed a direct connection from %s: a '%s' frame of %d bytes is %s", peer, kind[:40],
                        length, "of a kind not served" if limit is None else f"over the limit of {limit}")
            return False
        body = await reader.readexactly(length)
        got = await reader.readexactly(TAG_BYTES)
        header = _KIND_LEN.pack(n) + kind_bytes + _LENGTH.pack(length)
        if not hmac.compare_digest(got, tag(ticket.key, nonce, seq, b"q", header, body)):
            log.warning("closed a direct connection from %s: a '%s' frame's tag is wrong (altered or forged)",
                        peer, kind)
            return False
        nbytes = len(header) + length + TAG_BYTES
        self.host.count(peer, kind, "in", nbytes)
        await self.host.arrived(nbytes, kind, peer)
        status, reply = await self.host.answer(kind, peer, body)
        head = _REPLY.pack(status, len(reply))
        frame = (head, reply, tag(ticket.key, nonce, seq, b"r", head, reply))
        await self.host.shaped_write(writer, frame)
        self.host.count(peer, kind, "out", sum(len(p) for p in frame))
        return True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


@dataclass
class DirectConnection:
    """One open, authenticated connection to a peer's direct server; one request at a time."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    key: bytes
    nonce: bytes
    seq: int = 0

    def request_frame(self, kind: str, body: bytes) -> tuple[bytes, bytes, bytes]:
        """(header, body, tag): written one after the other, so that a large body is never copied."""
        k = kind.encode()
        header = _KIND_LEN.pack(len(k)) + k + _LENGTH.pack(len(body))
        return header, body, tag(self.key, self.nonce, self.seq, b"q", header, body)

    async def read_reply(self, max_bytes: int) -> tuple[int, bytes, int]:
        """(status, body, bytes read) of the reply to the last request; ValueError if it is not genuine."""
        head = await self.reader.readexactly(_REPLY.size)
        status, length = _REPLY.unpack(head)
        if length > max_bytes:
            raise ValueError(f"a reply of {length} bytes, over the limit of {max_bytes}")
        body = await self.reader.readexactly(length)
        got = await self.reader.readexactly(TAG_BYTES)
        if not hmac.compare_digest(got, tag(self.key, self.nonce, self.seq, b"r", head, body)):
            raise ValueError("a reply whose tag is wrong (altered or forged)")
        self.seq += 1
        return status, body, len(head) + length + TAG_BYTES

    def close(self) -> None:
        self.writer.close()


@dataclass
class DirectDialer:
    """Client side: a ticket per peer (asked for over libp2p), pooled connections, and who cannot be dialed.

    A peer not dialed yet is found out in the background (`probe`: its ticket, one connection) while its
    frames go over libp2p, so no request waits on a ticket or on a dial that times out behind NAT."""

    ask_ticket: Callable[[str], Awaitable[bytes]]
    connect_timeout_s: float = 2.0
    retry_after_s: float = 600.0
    idle_per_peer: int = 4
    _tickets: dict[str, Ticket] = field(default_factory=dict)
    _idle: dict[str, list[DirectConnection]] = field(default_factory=dict)
    _unreachable: dict[str, float] = field(default_factory=dict)
    _probes: dict[str, asyncio.Task] = field(default_factory=dict)

    def reachable(self, peer: str) -> bool:
        return self._unreachable.get(peer, 0.0) <= time.monotonic()

    def _give_up(self, peer: str, why: str) -> None:
        if self.reachable(peer):
            log.info("direct channel to %s: %s; its large frames go over libp2p for %.0f s", peer, why,
                     self.retry_after_s)
        self._unreachable[peer] = time.monotonic() + self.retry_after_s
        self.broken(peer)

    async def probe(self, peer: str) -> bool:
        """Ask `peer` for a ticket and dial it once (or wait for the probe already under way); whether its
        frames can now go direct."""
        if peer in self._tickets:
            return True
        if not self.reachable(peer):
            return False
        task = self._probes.get(peer)
        if task is None:
            task = self._probes[peer] = asyncio.ensure_future(self._probe(peer))
        await asyncio.shield(task)
        return peer in self._tickets

    async def _probe(self, peer: str) -> None:
        try:
            ticket = Ticket.from_bytes(await self.ask_ticket(peer))
            conn = await self._dial(ticket)
            self._tickets[peer] = ticket
            self.give_back(peer, conn)
        except DirectRefused as e:
            self._give_up(peer, str(e))
        except Exception as e:  # no ticket (an older peer, direct off there) or a broken one
            self._give_up(peer, f"no ticket ({type(e).__name__}: {str(e)[:120]})")
        finally:
            self._probes.pop(peer, None)

    async def _dial(self, ticket: Ticket) -> DirectConnection:
        async def one(host: str) -> DirectConnection:
            reader, writer = await asyncio.open_connection(host, ticket.port)
            try:
                writer.write(MAGIC + ticket.token)
                await writer.drain()
                nonce = await reader.readexactly(NONCE_BYTES)
            except BaseException:
                writer.close()
                raise
            return DirectConnection(reader, writer, ticket.key, nonce)

        tries = [asyncio.ensure_future(one(h)) for h in ticket.hosts]
        try:
            for next_done in asyncio.as_completed(tries, timeout=self.connect_timeout_s):
                try:
                    conn = await next_done
                except (OSError, asyncio.IncompleteReadError):
                    continue
                for t in tries:
                    if not t.done():
                        t.cancel()
                    elif not t.cancelled() and t.exception() is None and t.result() is not conn:
                        t.result().close()
                return conn
        except TimeoutError:
            pass
        finally:
            for t in tries:
                t.cancel()
        raise DirectRefused(f"no answer at {', '.join(ticket.hosts) or 'no address'} port {ticket.port}")

    async def connection(self, peer: str) -> DirectConnection:
        """An idle or new connection to `peer`; DirectRefused when libp2p should carry this request (the peer
        cannot be dialed, or is not found out yet: then a probe starts in the background)."""
        if not self.reachable(peer):
            raise DirectRefused("unreachable")
        idle = self._idle.get(peer, [])
        while idle:
            conn = idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.close()  # the server closed it while it sat idle (it restarted, or it closed on us)
        ticket = self._tickets.get(peer)
        if ticket is None:
            if peer not in self._probes:
                self._probes[peer] = asyncio.ensure_future(self._probe(peer))
            raise DirectRefused("not dialed yet")
        try:
            return await self._dial(ticket)
        except DirectRefused as e:
            self._give_up(peer, str(e))
            raise

    def give_back(self, peer: str, conn: DirectConnection) -> None:
        idle = self._idle.setdefault(peer, [])
        if len(idle) < self.idle_per_peer and self.reachable(peer):
            idle.append(conn)
        else:
            conn.close()

    def broken(self, peer: str) -> None:
        """A connection failed mid-request: the ticket may be stale (the peer restarted); probe again next time."""
        self._tickets.pop(peer, None)
        for conn in self._idle.pop(peer, []):
            conn.close()

    def close(self) -> None:
        for task in self._probes.values():
            task.cancel()
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

"""Framed request/response messages between peers over hivemind's libp2p streams, and large ones
over a direct TCP channel where one is enabled (swarm/net/direct.py, direct_route.py, docs/wire.md).

This room moves opaque bodies (msgpack made by `protocol/wire.py`) from one peer to another
and counts every byte it puts on or takes off the wire. It knows nothing about what the
bodies mean: validation is the handler's job.

One libp2p protocol id per message kind: f"/{namespace}/{kind}/1". One stream per request:
the client opens it, writes one request frame, reads one reply frame and closes it.

Framing (all integers big-endian):

    request frame = length (4 bytes) + body                      -> body + 4 bytes
    reply frame   = status (1 byte) + length (4 bytes) + body    -> body + 5 bytes
    status 0 = ok (body is the handler's reply); status 1 = error (body is one UTF-8 sentence)

So a round trip of a request body q and a reply body r costs (q + 4) + (r + 5) bytes on the
wire (direct: `framing_bytes`), which the counters record: requests "out" at the sender, "in" at the
receiver, replies the other way round, per (remote peer, kind, direction). (libp2p's own
stream headers, noise/TLS and yamux framing are below us and are not counted.)

Link emulation: with a `link` (`HomeLink`, swarm/net/shaper.py), every frame this side writes,
request or reply, to whichever peer, first waits on the link's one uplink (serialization and
latency), and every frame it has read waits on its one downlink's queue before it is used:
a home peer's connection, shared by all its traffic.

Ordered kinds (`ordered_kinds`, a peer's activations and gradients): their request frames leave
one at a time, first come first served, each as soon as the one before has left this side (the
shaper's last byte; without a shaper's bandwidth, a link-bound frame's reply), rather than all
sharing the uplink and arriving together (`SendOrder`, swarm/net/send_order.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import warnings

with warnings.catch_warnings():
    # importing hivemind runs torch.jit.script, which warns that it is deprecated; only that.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    from hivemind.p2p import P2P, PeerID

from peer.daemon.interfaces import Handler

from .direct import DirectDialer, DirectServer
from .direct_route import DirectRoute
from .frame_accounting import FrameAccounting
from .frame_trace import FrameTrace
from .framing import (
    DIRECT_MIN_BYTES,
    LENGTH,
    MAX_LENGTH_FIELD,
    REFUSAL_LINGER_S,
    REPLY_HEADER,
    REPLY_LINGER_S,
    REPLY_OVERHEAD,
    REQUEST_OVERHEAD,
    SMALL_REQUEST_BYTES,
    STATUS_ERROR,
    STATUS_OK,
    FrameError,
    LinkCounter,
    TransportError,
    check_name,
    discard,
    framing_bytes,
    short_text,
    wait_for_close,
)
from .home_link import HomeLink
from .send_order import SendOrder, Turn

__all__ = ["Handler", "TransportError", "LinkCounter", "Transport", "REQUEST_OVERHEAD", "REPLY_OVERHEAD",
           "framing_bytes", "DIRECT_MIN_BYTES"]

log = logging.getLogger(__name__)

class Transport(FrameAccounting, DirectRoute):
    """Serves and sends framed messages over one `hivemind.p2p.P2P` (usually `dht.replicate_p2p()`), and its
    large ones over a direct TCP channel where one is enabled (`enable_direct`, swarm/net/direct_route.py)."""

    def __init__(
        self,
        p2p: P2P,
        namespace: str,
        *,
        max_frame_bytes: int = 64 << 20,
        timeout: float = 60.0,
        link: HomeLink | None = None,
        ordered_kinds: tuple[str, ...] = (),
    ) -> None:
        if not 0 < max_frame_bytes <= MAX_LENGTH_FIELD:
            raise ValueError(f"max_frame_bytes must be between 1 and {MAX_LENGTH_FIELD}, not {max_frame_bytes}.")
        self.p2p = p2p
        self.namespace = check_name("namespace", namespace)
        self.max_frame_bytes = max_frame_bytes
        self.timeout = timeout
        self.link = link
        self.ordered_kinds = frozenset(ordered_kinds)
        self.send_order = SendOrder()
        self._counters: dict[tuple[str, str, str], LinkCounter] = {}
        self._served: dict[str, str] = {}  # kind -> protocol id
        self._limits: dict[str, int] = {}  # kind -> request size limit, where it is below max_frame_bytes
        self._inflight: set[asyncio.Task] = set()
        self._closed = False
        self._handlers: dict[str, Handler] = {}
        self._direct: DirectServer | None = None
        self.trace: FrameTrace | None = None  # every frame's timeline (swarm/net/frame_trace.py), when asked for
        self._frame_numbers = itertools.count(1)  # the trace's numbers of the requests this transport sends
        self._dialer: DirectDialer | None = None
        self.direct_min_bytes = DIRECT_MIN_BYTES
        self.direct_requests: dict[str, int] = {}  # kind -> requests sent over the direct channel (their bytes
        # are counted with the rest; this says how many carried the direct framing, docs/wire.md)

    def protocol_id(self, kind: str) -> str:
        return f"/{self.namespace}/{check_name('kind', kind)}/1"

    async def answer(self, kind: str, peer: str, body: bytes) -> tuple[int, bytes]:
        """The handler's reply to one request (STATUS_OK), or one sentence saying why not (STATUS_ERROR)."""
        handler = self._handlers.get(kind)
        try:
            if handler is None:
                raise FrameError(f"this peer does not serve '{kind}'.")
            try:
                reply = await handler(body, peer)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                raise FrameError(f"the '{kind}' handler failed: {type(e).__name__}: {e}".rstrip(".") + ".") from e
            if not isinstance(reply, (bytes, bytearray, memoryview)):
                raise FrameError(f"the '{kind}' handler returned {type(reply).__name__}, not bytes.")
            if len(reply) > self.max_frame_bytes:
                raise FrameError(f"reply of {len(reply)} bytes is over the limit of {self.max_frame_bytes}.")
        except FrameError as e:
            log.warning("refused a '%s' request from %s: %s", kind, peer, e)
            return STATUS_ERROR, str(e).encode("utf-8")
        self._trace("answered", kind, peer, len(reply))
        return STATUS_OK, bytes(reply)

    async def serve(self, kind: str, handler: Handler, max_bytes: int | None = None) -> None:
        """Answer requests of `kind` with `handler(body, remote_peer_id)`; requests of more than
        `max_bytes` (default: the transport's limit) are refused before their body is read."""
        if self._closed:
            raise RuntimeError("this transport is closed.")
        proto = self.protocol_id(kind)
        if kind in self._served:
            raise ValueError(f"this transport already serves the kind {kind!r}.")
        if max_bytes is not None:
            self._limits[kind] = min(max_bytes, self.max_frame_bytes)

        async def on_stream(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._handle_stream(kind, info.peer_id.to_base58(), reader, writer)

        await self.p2p.add_binary_stream_handler(proto, on_stream)
        self._served[kind] = proto
        self._handlers[kind] = handler

    async def unserve(self, kind: str) -> None:
        """Stop answering requests of `kind` (a peer that moves to another stage re-serves)."""
        proto = self._served.pop(kind, None)
        self._limits.pop(kind, None)
        self._handlers.pop(kind, None)
        if proto is not None:
            try:
                await self.p2p.remove_binary_stream_handler(proto)
            except Exception as e:  # the daemon may already be gone; nothing left to remove then
                log.debug("could not remove the '%s' handler: %s", kind, short_text(e))

    async def _read_request(self, peer: str, kind: str, reader: asyncio.StreamReader) -> bytes:
        try:
            header = await reader.readexactly(REQUEST_OVERHEAD)
        except asyncio.IncompleteReadError as e:
            if e.partial:
                self._count(peer, kind, "in", len(e.partial))
            raise FrameError(f"the request ended after {len(e.partial)} of {REQUEST_OVERHEAD} header bytes.") from None
        (length,) = LENGTH.unpack(header)
        limit = self._limits.get(kind, self.max_frame_bytes)
        if length > limit:
            self._count(peer, kind, "in", len(header))
            raise FrameError(f"frame of {length} bytes is over the limit of {limit}.", sender_busy=True)
        try:
            body = await reader.readexactly(length)
        except asyncio.IncompleteReadError as e:
            self._count(peer, kind, "in", len(header) + len(e.partial))
            raise FrameError(
                f"the request frame was truncated: {len(e.partial)} of {length} body bytes arrived.") from None
        self._count(peer, kind, "in", len(header) + length)
        await self._shaped_arrival(len(header) + length, kind, peer)
        return body

    async def _handle_stream(
        self, kind: str, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Every failure ends here as one log line and, if the stream still takes it, an error
        # reply: a bad or hostile request must never take the serving peer down.
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            try:
                body = await asyncio.wait_for(self._read_request(peer, kind, reader), self.timeout)
            except TimeoutError:
                raise FrameError(f"the request was not received within {self.timeout:g} s.") from None
            status, reply = await self.answer(kind, peer, body)
            await self._send_reply(writer, peer, kind, status, reply)
            if status != STATUS_OK:
                return
            # Closing our end at once can reset the libp2p stream before the reply is flushed
            # (seen under CPU load: delivered requests whose reply was lost). The client closes
            # the stream once it has read the reply, so wait for that, bounded.
            await wait_for_close(reader, REPLY_LINGER_S)
        except FrameError as e:
            log.warning("refused a '%s' request from %s: %s", kind, peer, e)
            await self._send_reply(writer, peer, kind, STATUS_ERROR, str(e).encode("utf-8"))
            if e.sender_busy:
                await discard(reader, min(self.timeout, REFUSAL_LINGER_S))
        except asyncio.CancelledError:
            pass  # close() is tearing the server down; the client sees the stream close
        except Exception as e:  # a broken stream while reading or writing
            log.warning("dropped a '%s' stream from %s: %s: %s", kind, peer, type(e).__name__, e)
        finally:
            writer.close()
            if task is not None:
                self._inflight.discard(task)

    async def _send_reply(self, writer: asyncio.StreamWriter, peer: str, kind: str, status: int, body: bytes) -> None:
        if status == STATUS_OK and len(body) > self.max_frame_bytes:
            status = STATUS_ERROR
            body = f"reply of {len(body)} bytes is over the limit of {self.max_frame_bytes}.".encode()
        frame = (REPLY_HEADER.pack(status, len(body)), body)
        try:
            await asyncio.wait_for(self._shaped_write(writer, frame), self.timeout)
        except (TimeoutError, ConnectionError, OSError) as e:
            # debug only: the caller already logged why this stream went wrong, or the client
            # gave up (and logs that on its side).
            log.debug("could not reply to a '%s' request from %s: %s", kind, peer, type(e).__name__)
            return
        self._count(peer, kind, "out", REPLY_OVERHEAD + len(body))

    async def request(self, peer_id: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        """Send `body` to `peer_id`'s `kind` handler and return its reply body."""
        if self._closed:
            raise RuntimeError("this transport is closed.")
        proto = self.protocol_id(kind)
        limit = self.timeout if timeout is None else timeout
        if len(body) > self.max_frame_bytes:
            raise TransportError(
                f"request of {len(body)} bytes is over the limit of {self.max_frame_bytes}.",
                kind=kind, peer=peer_id, reason="limit",
            )
        try:
            remote = PeerID.from_base58(peer_id)
        except Exception:
            raise TransportError(f"{peer_id!r} is not a valid peer id.", kind=kind, peer=peer_id,
                                 reason="connection") from None
        try:
            return await asyncio.wait_for(self._exchange(remote, peer_id, kind, proto, bytes(body)), limit)
        except TimeoutError:
            raise TransportError(
                f"'{kind}' request to {peer_id} got no reply within {limit:g} s.",
                kind=kind, peer=peer_id, reason="timeout",
            ) from None

    async def _exchange(self, remote: PeerID, peer: str, kind: str, proto: str, body: bytes) -> bytes:
        frame = (LENGTH.pack(len(body)), body)
        traced = self._begin_traced_request()
        self._trace("queued", kind, peer, len(body))
        # an ordered frame lines up before its stream opens: its place is the order it was sent in
        turn = self.send_order.line_up(REQUEST_OVERHEAD + len(body)) if kind in self.ordered_kinds else None
        try:
            conn = await self._direct_connection(peer, kind, len(body))
            if conn is not None:
                return await self._direct_exchange(conn, peer, kind, body, turn)
            try:
                _, reader, writer = await self.p2p.call_binary_stream_handler(remote, proto)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                raise TransportError(
                    f"could not open a '{kind}' stream to {peer}: {short_text(e)}.", kind=kind, peer=peer,
                    reason="connection",
                ) from e
            try:
                return await self._send_then_read(peer, kind, writer, frame, turn,
                                                  lambda: self._read_reply(reader, peer, kind))
            finally:
                writer.close()
        finally:
            if turn is not None:
                turn.release(measured=False)  # a no-op once the frame has left
            self._end_traced_request(traced)

    async def _send_then_read(self, peer: str, kind: str, writer: asyncio.StreamWriter, frame: tuple[bytes, ...],
                              turn: Turn | None, read_reply, direct: bool = False) -> bytes:
        opened, size = asyncio.get_running_loop().time(), sum(len(p) for p in frame)
        if turn is not None:
            await turn.wait()
        self._trace("turn", kind, peer, size)
        # where the shaper does not say when the last byte left, a link-bound frame holds its
        # turn until its reply (swarm/net/send_order.py)
        held = turn is not None and not self._departures_seen() and self.send_order.holds(size)
        try:
            await self._shaped_write(writer, frame, None if held else turn)
        except (ConnectionError, OSError) as e:
            raise TransportError(
                f"the stream to {peer} broke while sending a '{kind}' request: {short_text(e)}.",
                kind=kind, peer=peer, reason="connection",
            ) from e
        self._count(peer, kind, "out", size)
        self._trace("sent", kind, peer, size)
        if direct:
            self.direct_requests[kind] = self.direct_requests.get(kind, 0) + 1
        reply = await read_reply()
        self._trace("reply", kind, peer, len(reply))
        if held:
            self.send_order.note_reply(turn)
            turn.release()
        elif turn is None and size <= SMALL_REQUEST_BYTES:
            self.send_order.note_round_trip(asyncio.get_running_loop().time() - opened)
        return reply

    async def _read_reply(self, reader: asyncio.StreamReader, peer: str, kind: str) -> bytes:
        def fail(message: str, reason: str = "protocol") -> TransportError:
            return TransportError(message, kind=kind, peer=peer, reason=reason)

        try:
            header = await reader.readexactly(REPLY_OVERHEAD)
        except asyncio.IncompleteReadError:
            raise fail(f"{peer} closed the '{kind}' stream without replying.", "connection") from None
        except (ConnectionError, OSError) as e:
            raise fail(f"the stream to {peer} broke while waiting for a '{kind}' reply: {short_text(e)}.",
                       "connection") from e
        status, length = REPLY_HEADER.unpack(header)
        if length > self.max_frame_bytes:
            raise fail(f"{peer} sent a '{kind}' reply of {length} bytes, over the limit of {self.max_frame_bytes}.")
        try:
            reply = await reader.readexactly(length)
        except asyncio.IncompleteReadError as e:
            raise fail(f"{peer}'s '{kind}' reply was truncated at {len(e.partial)} of {length} bytes.") from None
        self._count(peer, kind, "in", REPLY_OVERHEAD + length)
        await self._shaped_arrival(REPLY_OVERHEAD + length, kind, peer)
        return self._reply_body(status, reply, peer, kind)

    @staticmethod
    def _reply_body(status: int, reply: bytes, peer: str, kind: str) -> bytes:
        if status == STATUS_ERROR:
            text = short_text(reply.decode("utf-8", errors="replace"), 500)
            raise TransportError(f"{peer} refused the '{kind}' request: {text}", kind=kind, peer=peer, reason="remote")
        if status != STATUS_OK:
            raise TransportError(f"{peer} sent a '{kind}' reply with unknown status {status}.", kind=kind, peer=peer,
                                 reason="protocol")
        return reply

    async def close(self) -> None:
        """Stop serving: unregister every handler and end requests still being handled."""
        self._closed = True
        if self._dialer is not None:
            self._dialer.close()
        if self._direct is not None:
            await self._direct.close()
        served, self._served = self._served, {}
        for kind, proto in served.items():
            try:
                await self.p2p.remove_binary_stream_handler(proto)
            except Exception as e:  # the daemon may already be gone; nothing left to remove then
                log.debug("could not remove the '%s' handler: %s", kind, short_text(e))
        tasks = [t for t in self._inflight if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

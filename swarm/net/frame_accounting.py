"""What a `Transport` (swarm/net/transport.py) does with every frame besides carrying it: counts its bytes per
(peer, kind, direction), passes it through the peer's emulated home link (swarm/net/home_link.py: the uplink
before it is written, the downlink after it is read) and, when asked, writes it into the frame trace
(swarm/net/frame_trace.py). Both routes use these, libp2p's and the direct channel's (swarm/net/direct_route.py).

A mixin: it reads the transport's `_counters`, `link`, `trace` and `_frame_numbers`, set in `Transport.__init__`.
The events of one request this peer sends carry one frame number: the request's own task holds it
(a context variable), so the reply's arrival gets it too, and a request that arrives (another task) none.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from contextvars import ContextVar, Token

from .frame_trace import FrameTrace
from .framing import LinkCounter
from .home_link import HomeLink
from .send_order import Turn

__all__ = ["FrameAccounting"]

_REQUEST: ContextVar[int | None] = ContextVar("traced_request", default=None)  # in a task that sends a request


class FrameAccounting:
    _counters: dict[tuple[str, str, str], LinkCounter]
    link: HomeLink | None
    trace: FrameTrace | None
    _frame_numbers: itertools.count

    def _count(self, peer: str, kind: str, direction: str, nbytes: int) -> None:
        key = (peer, kind, direction)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = LinkCounter(peer, kind, direction)
        counter.bytes += nbytes
        counter.messages += 1

    def counters(self) -> list[LinkCounter]:
        return [LinkCounter(c.peer, c.kind, c.direction, c.bytes, c.messages) for c in self._counters.values()]

    def _total(self, direction: str, kind: str | None) -> int:
        return sum(c.bytes for c in self._counters.values() if c.direction == direction and kind in (None, c.kind))

    def bytes_sent(self, kind: str | None = None) -> int:
        return self._total("out", kind)

    def bytes_received(self, kind: str | None = None) -> int:
        return self._total("in", kind)

    def _departures_seen(self) -> bool:
        """Does the built-in shaper tell when a frame's last byte has left (it models the bandwidth)?"""
        return self.link is not None and self.link.uplink.bandwidth_bps is not None

    async def _shaped_write(self, writer: asyncio.StreamWriter, frame: bytes | tuple[bytes, ...],
                            turn: Turn | None = None) -> None:
        """Write one frame (or its parts, each written as it is: a large body is not copied into a joined
        frame); a `turn` is given up once the frame has left (the shaper's last byte, else the drain). A failed
        write's turn is given up, unmeasured, by `_exchange`."""
        parts = (frame,) if isinstance(frame, (bytes, bytearray, memoryview)) else frame
        if self.link is not None:
            await self.link.send(sum(len(p) for p in parts), None if turn is None else turn.release)
        for part in parts:
            writer.write(part)
        await writer.drain()
        if turn is not None:
            turn.release()

    async def _shaped_arrival(self, nbytes: int, kind: str, peer: str) -> None:
        began = time.monotonic()
        if self.link is not None:
            await self.link.receive(nbytes)
        self._trace("arrived", kind, peer, nbytes, time.monotonic() - began)

    def _begin_traced_request(self) -> Token | None:
        """Called by the task that sends a request, before its first event: its events get a number until
        `_end_traced_request` (the task may go on to other work: without a timeout, wait_for runs in it)."""
        return _REQUEST.set(next(self._frame_numbers)) if self.trace is not None else None

    @staticmethod
    def _end_traced_request(token: Token | None) -> None:
        if token is not None:
            _REQUEST.reset(token)

    def _trace(self, event: str, kind: str, peer: str, nbytes: int, wait: float | None = None) -> None:
        if self.trace is not None:
            self.trace.note(event, kind, peer, nbytes, wait, _REQUEST.get())

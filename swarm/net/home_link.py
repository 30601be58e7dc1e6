"""A peer's home connection: one uplink and one downlink, each shared by all its traffic.

`swarm/net/transport.py` calls `HomeLink.send(nbytes)` before it writes any frame (request or
reply, to any peer) and `HomeLink.receive(nbytes)` after it has read one.

The uplink is a `LinkShaper` (shaper.py: fair sharing among frames in flight, burst, latency).
The downlink (`DownlinkShaper`) is a queue of its own bandwidth that every received frame passes
through. A frame's bytes flow into the downlink while they leave the sender's uplink, so its own
n / rate of downlink time overlaps the sender's serialization (exactly, when the sender's uplink
is no faster than this downlink: equal rates, or a home line's faster downlink): a frame whose
last byte arrives at t had its bytes come in over [t - n / rate, t], and it is through at
max(t, t - n / rate + n / rate + u), u the downlink time other frames use after t - n / rate (a
fluid queue: the line does the other frames' work and this one's from when its bytes began);
the receiver waits for what of that runs past t. One stream costs nothing extra, a small frame
right behind a large one from the same sender included; two senders into one downlink share it;
a frame waits only for the part of another's transfer that overlapped its own, and a small frame
that came in while a large one was still arriving costs the large one only its own time (before
2026-12-02 the downlink kept one "free at" time, so such a small frame, a ping or a reply, made
the large frame start after it: stage 1 of a link-bound dense run waited 0.1-0.5 s more for every
activation, growing through the step). (A sender faster than this downlink is not slowed to its
rate: the receiver cannot tell when such a frame started.)

Packets (`Packets`): a home line's rate counts IP packets, not our frames. A frame of n bytes
takes n + ceil(n / mss) * header bytes of the line (TCP/IPv4 with timestamps in Ethernet
frames: mss 1448, header 66, what tc counts on a veth), and the receiving side sends back one
bare acknowledgement (header bytes) per two segments on its uplink, which the sender's
downlink carries. Both take line time and are counted in `stats()`; the transport's own
counters keep counting frames (the wire format's bytes).
"""
from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .shaper import LinkShaper, parse_bandwidth

__all__ = ["DownlinkShaper", "HomeLink", "Packets"]

HORIZON_S = 60.0  # busy intervals kept at least this long (and twice the longest frame), for frames that began then
MAX_INTERVALS = 4096  # and at most this many: each arrival sums over them


@dataclass(frozen=True)
class Packets:
    """How frames become packets on the line (module docstring)."""

    mss: int = 1448  # payload bytes per segment: 1500 MTU - 20 IPv4 - 32 TCP with timestamps
    header: int = 66  # 14 Ethernet + 20 IPv4 + 32 TCP, per segment; also the size of a bare ACK
    segments_per_ack: int = 2  # delayed ACKs

    def on_line(self, nbytes: int) -> int:
        """Line bytes of a frame: payload plus one header per segment."""
        return nbytes + math.ceil(nbytes / self.mss) * self.header

    def acks(self, nbytes: int) -> int:
        """Line bytes of the acknowledgements that receiving a frame sends back."""
        return math.ceil(nbytes / (self.mss * self.segments_per_ack)) * self.header


class DownlinkShaper:
    """One emulated incoming link: a queue of its bandwidth that received frames pass through, each from
    when its bytes began to arrive (module docstring)."""

    def __init__(
        self,
        bandwidth_bps: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self._rate = None if bandwidth_bps is None else parse_bandwidth(float(bandwidth_bps)) / 8  # bytes/s
        self._clock, self._sleep = clock, sleep
        # when each frame received so far had the downlink: (start, end, the largest end up to it), in the order
        # they were received. Ends are not in order (a small frame can be through before a large one queued ahead
        # of it), so the running largest end is what lets an arrival stop scanning at the first interval (from
        # the newest back) before which nothing can still overlap it; without it every arrival summed over all
        # MAX_INTERVALS, a quarter of a simulated run's time. Dropping old intervals leaves the bound an upper one.
        self._busy: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=MAX_INTERVALS)
        self._longest = 0.0  # the longest frame's n / rate so far
        self.bytes = 0

    @property
    def unlimited(self) -> bool:
        return self._rate is None

    @property
    def busy_s(self) -> float:
        return 0.0 if self._rate is None else self.bytes / self._rate

    def queue_delay_for(self, nbytes: int) -> float:
        """A frame of `nbytes` whose last byte arrives now, its bytes in since b = now - n / rate: through
        at end = max(now, b + n / rate + u), u the downlink time the frames received before it use after b;
        it is then recorded as busy over [end - n / rate, end]. Returns end - now, the wait past now."""
        if nbytes < 0:
            raise ValueError(f"cannot receive a negative number of bytes ({nbytes}).")
        self.bytes += nbytes
        if self._rate is None:
            return 0.0
        now, own = self._clock(), nbytes / self._rate
        self._longest = max(self._longest, own)
        horizon = now - max(HORIZON_S, 2 * self._longest)
        while self._busy and self._busy[0][1] < horizon:
            self._busy.popleft()
        began = now - own
        used = sum(self._overlaps(began))
        through = max(now, began + own + used)
        self._busy.append((through - own, through, max(through, self._busy[-1][2]) if self._busy else through))
        return through - now

    def _overlaps(self, began: float) -> list[float]:
        """Each recorded interval's time after `began` (those that end after it), oldest first: summed in the
        order received, so the figure is the one a scan of every interval gives, bit for bit."""
        parts = []
        for start, end, latest in reversed(self._busy):
            if latest <= began:
                break  # no interval up to here ends after `began`
            if end > began:
                parts.append(end - max(start, began))
        parts.reverse()
        return parts

    async def receive(self, nbytes: int) -> None:
        delay = self.queue_delay_for(nbytes)
        if delay > 0.0:
            await self._sleep(delay)

    def occupy(self, nbytes: int) -> None:
        """Bytes that use the line but that nobody waits for (acknowledgements)."""
        self.queue_delay_for(nbytes)


class HomeLink:
    """One peer's home connection: an uplink shared by every frame it sends (with the one-way
    latency) and a downlink shared by every frame it receives (module docstring)."""

    def __init__(self, uplink: LinkShaper, downlink: DownlinkShaper, packets: Packets | None = Packets()) -> None:
        self.uplink, self.downlink, self.packets = uplink, downlink, packets

    @classmethod
    def from_strings(
        cls,
        bandwidth: str | None,
        latency: str | None = "0",
        downlink: str | None = None,
        *,
        packets: Packets | None = Packets(),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> HomeLink:
        """From CLI-style strings, e.g. ("80mbit", "20ms"); the downlink has the uplink's bandwidth
        unless `downlink` names its own. `packets=None` shapes frame bytes alone."""
        up = LinkShaper.from_strings(bandwidth, latency, clock=clock, sleep=sleep)
        down = DownlinkShaper(parse_bandwidth(bandwidth if downlink is None else downlink), clock=clock, sleep=sleep)
        return cls(up, down, packets)

    @property
    def unlimited(self) -> bool:
        return self.uplink.unlimited and self.downlink.unlimited

    async def send(self, nbytes: int, on_sent: Callable[[], object] | None = None) -> None:
        """Wait until a frame of `nbytes` sent now would have arrived (serialization + latency);
        its acknowledgements come back on the downlink. `on_sent()`: when its last byte has left."""
        if self.packets is None:
            await self.uplink.transmit(nbytes, on_sent)
            return
        self.downlink.occupy(self.packets.acks(nbytes))
        await self.uplink.transmit(self.packets.on_line(nbytes), on_sent)

    async def receive(self, nbytes: int) -> None:
        """Wait while the downlink is still busy with frames that arrived before this one; the
        acknowledgements of this one go out on the uplink."""
        if self.packets is None:
            await self.downlink.receive(nbytes)
            return
        self.uplink.occupy(self.packets.acks(nbytes))
        await self.downlink.receive(self.packets.on_line(nbytes))

    def stats(self) -> dict[str, float]:
        """Line bytes (packets, acknowledgements included) and busy seconds per direction."""
        return {"uplink_bytes": self.uplink.bytes, "uplink_busy_s": self.uplink.busy_s,
                "downlink_bytes": self.downlink.bytes, "downlink_busy_s": self.downlink.busy_s}

    def __repr__(self) -> str:
        return f"HomeLink(up={self.uplink!r}, down={self.downlink!r})"

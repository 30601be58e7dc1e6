"""A peer's home connection: one uplink and one downlink, each shared by all its traffic.

`swarm/net/transport.py` calls `HomeLink.send(nbytes)` before it writes any frame (request or
reply, to any peer) and `HomeLink.receive(nbytes)` after it has read one.

The uplink is a `LinkShaper` (shaper.py: fair sharing among frames in flight, burst, latency).
The downlink (`DownlinkShaper`) is a token bucket of its own bandwidth that every received
frame passes through. A frame's bytes flow into the downlink while they leave the sender's
uplink, so its own n / rate of downlink time overlaps the sender's serialization (exactly,
when the sender's uplink is no faster than this downlink: equal rates, or a home line's
faster downlink); what the receiver waits for on top is the downlink's backlog, i.e. frames
from other senders that arrived before it. One stream costs nothing extra; two senders into
one downlink share it.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from .shaper import BUCKET_SECONDS, MIN_BUCKET_BYTES, LinkShaper, parse_bandwidth

__all__ = ["DownlinkShaper", "HomeLink"]


class DownlinkShaper:
    """One emulated incoming link: a token bucket whose backlog received frames wait out."""

    def __init__(
        self,
        bandwidth_bps: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self._rate = None if bandwidth_bps is None else parse_bandwidth(float(bandwidth_bps)) / 8  # bytes/s
        self.depth = 0.0 if self._rate is None else max(float(MIN_BUCKET_BYTES), self._rate * BUCKET_SECONDS)
        self._clock, self._sleep = clock, sleep
        self._tokens = 0.0
        self._updated = clock()
        self.bytes = 0

    @property
    def unlimited(self) -> bool:
        return self._rate is None

    @property
    def busy_s(self) -> float:
        return 0.0 if self._rate is None else self.bytes / self._rate

    def queue_delay_for(self, nbytes: int) -> float:
        """Take `nbytes` from the bucket now; returns the wait beyond the frame's own n / rate,
        which overlapped the sender's uplink: the backlog of frames that arrived before it."""
        if nbytes < 0:
            raise ValueError(f"cannot receive a negative number of bytes ({nbytes}).")
        self.bytes += nbytes
        if self._rate is None:
            return 0.0
        now = self._clock()
        self._tokens = min(self.depth, self._tokens + max(0.0, now - self._updated) * self._rate)
        self._updated = now
        backlog = max(0.0, -self._tokens)
        self._tokens -= nbytes
        return backlog / self._rate

    async def receive(self, nbytes: int) -> None:
        delay = self.queue_delay_for(nbytes)
        if delay > 0.0:
            await self._sleep(delay)


class HomeLink:
    """One peer's home connection: an uplink shared by every frame it sends (with the one-way
    latency) and a downlink shared by every frame it receives (module docstring)."""

    def __init__(self, uplink: LinkShaper, downlink: DownlinkShaper) -> None:
        self.uplink, self.downlink = uplink, downlink

    @classmethod
    def from_strings(
        cls,
        bandwidth: str | None,
        latency: str | None = "0",
        downlink: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> HomeLink:
        """From CLI-style strings, e.g. ("80mbit", "20ms"); the downlink has the uplink's bandwidth
        unless `downlink` names its own."""
        up = LinkShaper.from_strings(bandwidth, latency, clock=clock, sleep=sleep)
        down = DownlinkShaper(parse_bandwidth(bandwidth if downlink is None else downlink), clock=clock, sleep=sleep)
        return cls(up, down)

    @property
    def unlimited(self) -> bool:
        return self.uplink.unlimited and self.downlink.unlimited

    async def send(self, nbytes: int) -> None:
        """Wait until a frame of `nbytes` sent now would have arrived (serialization + latency)."""
        await self.uplink.transmit(nbytes)

    async def receive(self, nbytes: int) -> None:
        """Wait while the downlink is still busy with frames that arrived before this one."""
        await self.downlink.receive(nbytes)

    def stats(self) -> dict[str, float]:
        """Bytes and busy seconds per direction (busy: transmitting at the line rate)."""
        return {"uplink_bytes": self.uplink.bytes, "uplink_busy_s": self.uplink.busy_s,
                "downlink_bytes": self.downlink.bytes, "downlink_busy_s": self.downlink.busy_s}

    def __repr__(self) -> str:
        return f"HomeLink(up={self.uplink!r}, down={self.downlink!r})"

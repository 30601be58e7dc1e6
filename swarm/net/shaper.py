"""Link emulation: how long bytes take to cross a home connection.

This room exists so that `swarm local` and the benchmarks can run a whole swarm on one
machine and still see the network a volunteer would see. A home peer has one uplink shared
by everything it sends and one downlink shared by everything it receives, and a distance
(one-way latency). `HomeLink` models exactly that for one peer; `swarm/net/transport.py` calls
`HomeLink.send(nbytes)` before it writes any frame (request or reply, to any peer) and
`HomeLink.receive(nbytes)` after it has read one. Nothing here touches sockets.

One direction (`LinkShaper`):

- a token bucket refilled at `bandwidth_bps / 8` bytes per second, `depth` bytes deep
  (max(64 KiB, 10 ms worth of bandwidth)). It starts empty, like a link that has only just
  come up, so a fresh link's first transfer pays its full serialization time; idle time then
  earns at most `depth` bytes of burst, as with tc's `tbf` qdisc.
- a send of n bytes takes n tokens at once and may drive the bucket into debt; the sender
  waits until the debt is repaid (its last byte has left), then `latency_s` more (its last
  byte has arrived). Because the debt is shared, concurrent messages queue behind each
  other for bandwidth, in the order they called `transmit`, while their latencies overlap.
- `busy_s` is the time the link spends transmitting: its bytes at its line rate, bytes * 8 /
  bandwidth (the same figure the kernel's qdisc byte counters give).

The peer (`HomeLink`): the uplink above, with the latency, paid once per frame. The downlink
is a second bucket of its own bandwidth that every received frame passes through. A frame's
bytes flow into the downlink while they leave the sender's uplink, so its own n / rate of
downlink time overlaps the sender's serialization (exactly, when the sender's uplink is no
faster than this downlink: equal rates, or a home line's faster downlink); what the receiver
waits for on top is the downlink's queue, i.e. frames from other senders still arriving.
So one stream costs n / rate + latency, and two senders into one downlink share it.

The clock and the sleep are injectable so tests can drive the shaper with virtual time.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable

__all__ = ["HomeLink", "LinkShaper", "parse_bandwidth", "parse_latency", "MIN_BUCKET_BYTES", "BUCKET_SECONDS"]

MIN_BUCKET_BYTES = 64 * 1024
BUCKET_SECONDS = 0.010

_BANDWIDTH_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]+)\s*$")
_LATENCY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ]*)\s*$")

# Bit units are matched case-insensitively ("80Mbit" == "80mbit"); byte units keep their
# capital B, because "Mb/s" conventionally means megabits and must not be read as bytes.
_BIT_UNITS = {
    "bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
    "bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9,
    "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9,
}
_BYTE_UNITS = {
    "B/s": 8.0, "kB/s": 8e3, "KB/s": 8e3, "MB/s": 8e6, "GB/s": 8e9,
    "KiB/s": 8.0 * 2**10, "MiB/s": 8.0 * 2**20, "GiB/s": 8.0 * 2**30,
}
_UNLIMITED = {"unlimited", "none", "inf", "infinite", "off"}
_LATENCY_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


def parse_bandwidth(text: str | float | int | None) -> float | None:
    """Turn "80mbit", "1gbit", "500kbit", "10MB/s" or "unlimited"/None into bits per second.

    Returns None for an unlimited link. A bare Python number is taken as bits per second; a
    string must carry its unit, because a bare "80" is too easy to misread.
    """
    if text is None:
        return None
    if isinstance(text, bool):
        raise ValueError(f"bandwidth must be a string such as '80mbit', not {text!r}.")
    if isinstance(text, (int, float)):
        return _checked_rate(float(text), repr(text))
    if not isinstance(text, str):
        raise ValueError(f"bandwidth must be a string such as '80mbit', not {type(text).__name__}.")
    if text.strip().lower() in _UNLIMITED:
        return None
    match = _BANDWIDTH_RE.match(text)
    if match is None:
        raise ValueError(f"bandwidth {text!r} is not a number with a unit such as '80mbit' or '10MB/s'.")
    number, unit = float(match.group(1)), match.group(2)
    if unit in _BYTE_UNITS:
        scale = _BYTE_UNITS[unit]
    elif unit.lower() in _BIT_UNITS:
        scale = _BIT_UNITS[unit.lower()]
    else:
        raise ValueError(
            f"bandwidth {text!r} has an unknown unit {unit!r}; use bit/kbit/mbit/gbit or B/s/KB/s/MB/s/GB/s."
        )
    return _checked_rate(number * scale, repr(text))


def _checked_rate(bps: float, shown: str) -> float:
    if not math.isfinite(bps) or bps <= 0:
        raise ValueError(f"bandwidth {shown} must be a positive, finite rate (or 'unlimited').")
    return bps


def parse_latency(text: str | float | int) -> float:
    """Turn "20ms", "0.02s", "150us" or "0" into seconds (one-way delay).

    A bare Python number is taken as seconds; in a string, only "0" may go without a unit.
    """
    if isinstance(text, bool):
        raise ValueError(f"latency must be a string such as '20ms', not {text!r}.")
    if isinstance(text, (int, float)):
        return _checked_delay(float(text), repr(text))
    if not isinstance(text, str):
        raise ValueError(f"latency must be a string such as '20ms', not {type(text).__name__}.")
    match = _LATENCY_RE.match(text)
    if match is None:
        raise ValueError(f"latency {text!r} is not a number with a unit such as '20ms' or '0.02s'.")
    number, unit = float(match.group(1)), match.group(2)
    if unit == "":
        if number != 0.0:
            raise ValueError(f"latency {text!r} has no unit; write e.g. '{match.group(1)}ms' or '{match.group(1)}s'.")
        return 0.0
    if unit.lower() not in _LATENCY_UNITS:
        raise ValueError(f"latency {text!r} has an unknown unit {unit!r}; use s, ms or us.")
    return _checked_delay(number * _LATENCY_UNITS[unit.lower()], repr(text))


def _checked_delay(seconds: float, shown: str) -> float:
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"latency {shown} must be a finite, non-negative delay.")
    return seconds


class LinkShaper:
    """One direction of an emulated link: a token bucket for bandwidth plus a fixed one-way latency."""

    def __init__(
        self,
        bandwidth_bps: float | None = None,
        latency_s: float = 0.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if bandwidth_bps is not None:
            bandwidth_bps = _checked_rate(float(bandwidth_bps), repr(bandwidth_bps))
        self.bandwidth_bps = bandwidth_bps
        self.latency_s = _checked_delay(float(latency_s), repr(latency_s))
        self._clock = clock
        self._sleep = sleep
        self._rate = None if bandwidth_bps is None else bandwidth_bps / 8.0  # bytes per second
        self.depth = 0.0 if self._rate is None else max(float(MIN_BUCKET_BYTES), self._rate * BUCKET_SECONDS)
        self._tokens = 0.0
        self._updated = clock()
        self.bytes = 0  # bytes that went through

    @classmethod
    def from_strings(
        cls,
        bandwidth: str | None,
        latency: str | None = "0",
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> LinkShaper:
        """Build a shaper from CLI-style strings such as ("80mbit", "20ms"); None means none of it."""
        delay = 0.0 if latency is None else parse_latency(latency)
        return cls(parse_bandwidth(bandwidth), delay, clock=clock, sleep=sleep)

    @property
    def unlimited(self) -> bool:
        return self._rate is None and self.latency_s == 0.0

    def delay_for(self, nbytes: int) -> float:
        """Reserve the link for `nbytes` now and return how long until they have arrived.

        The reservation happens here, synchronously, so callers that race each other are
        queued in call order; `transmit` is this plus the wait.
        """
        return self._reserve(nbytes) + self.latency_s

    def queue_delay_for(self, nbytes: int) -> float:
        """A downlink's share of a received frame: reserve `nbytes` now and return the wait beyond
        the frame's own n / rate, which overlapped the sender's uplink (module docstring)."""
        serialized = self._reserve(nbytes)
        return 0.0 if self._rate is None else max(0.0, serialized - nbytes / self._rate)

    def _reserve(self, nbytes: int) -> float:
        """Take `nbytes` tokens now; returns the seconds until the last of them has left."""
        if nbytes < 0:
            raise ValueError(f"cannot transmit a negative number of bytes ({nbytes}).")
        self.bytes += nbytes
        if self._rate is None:
            return 0.0
        now = self._clock()
        elapsed = max(0.0, now - self._updated)
        self._tokens = min(self.depth, self._tokens + elapsed * self._rate)
        self._updated = now
        self._tokens -= nbytes
        return max(0.0, -self._tokens) / self._rate

    @property
    def busy_s(self) -> float:
        """Seconds this link has spent transmitting: bytes * 8 / bandwidth (0 when unlimited)."""
        return 0.0 if self._rate is None else self.bytes / self._rate

    async def transmit(self, nbytes: int) -> None:
        """Wait as long as the link would take to deliver `nbytes` sent now."""
        delay = self.delay_for(nbytes)
        if delay > 0.0:
            await self._sleep(delay)

    async def receive(self, nbytes: int) -> None:
        """As a downlink: wait as long as `queue_delay_for(nbytes)` says."""
        delay = self.queue_delay_for(nbytes)
        if delay > 0.0:
            await self._sleep(delay)

    def __repr__(self) -> str:
        bw = "unlimited" if self.bandwidth_bps is None else f"{self.bandwidth_bps / 1e6:g}mbit"
        return f"LinkShaper({bw}, {self.latency_s * 1e3:g}ms)"


class HomeLink:
    """One peer's home connection: an uplink shared by every frame it sends (with the one-way
    latency) and a downlink shared by every frame it receives (module docstring)."""

    def __init__(self, uplink: LinkShaper, downlink: LinkShaper) -> None:
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
        down = LinkShaper.from_strings(bandwidth if downlink is None else downlink, "0", clock=clock, sleep=sleep)
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

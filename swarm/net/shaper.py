"""Link emulation, one direction: how long bytes take to leave a home uplink.

This room exists so that `swarm local` and the benchmarks can run a whole swarm on one
machine and still see the network a volunteer would see. `LinkShaper` is one uplink, a fluid
model of what TCP flows through one bottleneck do (a peer's whole connection, uplink and
downlink, is `HomeLink` in home_link.py):

- the frames in flight share the bandwidth equally (processor sharing): two 1 MB frames sent
  together at 8 Mbit/s both arrive after 2 s, and a 10-byte reply sent while a 1 MB frame is
  in flight gets half the rate and leaves at once, as interleaved packets of several
  connections (or of libp2p streams in one) do, rather than queueing whole behind it;
- a burst allowance, max(64 KiB, 10 ms of bandwidth), earned at the line rate while nothing
  is in flight (the link starts with none, like one that has just come up), which a new
  frame's first bytes use at once, as with tc's `tbf`;
- the one-way latency, added once to every frame after its last byte has left, overlapping
  other frames' transmission.

`busy_s` is the time it spent transmitting: its bytes at its line rate, bytes * 8 / bandwidth
(the figure the kernel's qdisc byte counters give). Also here: the parsers of "80mbit" and
"20ms". The clock and the sleep are injectable so tests can drive time virtually.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import time
from collections.abc import Awaitable, Callable

__all__ = ["LinkShaper", "parse_bandwidth", "parse_latency", "MIN_BUCKET_BYTES", "BUCKET_SECONDS"]

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
    """One emulated outgoing link: bandwidth shared fairly by the frames in flight, a burst
    allowance earned while idle, and a fixed one-way latency (module docstring)."""

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
        self._tokens = 0.0  # burst allowance, earned only while nothing is in flight
        self._updated = clock()
        self._left: dict[int, float] = {}  # frame id -> bytes still to serialize
        self._done_at: dict[int, float] = {}  # frame id -> the time its last byte left
        self._orphans: set[int] = set()  # frames nobody waits for (`occupy`)
        self._ids = itertools.count()
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

    @property
    def busy_s(self) -> float:
        """Seconds this link has spent transmitting: bytes * 8 / bandwidth (0 when unlimited)."""
        return 0.0 if self._rate is None else self.bytes / self._rate

    @property
    def in_flight(self) -> int:
        return len(self._left)

    def _advance(self, now: float) -> None:
        """Run the fluid model from the last update to `now`: the frames in flight share the rate
        equally, each leaving at its exact time; idle time earns burst tokens."""
        t = self._updated
        while t < now and self._left:
            n = len(self._left)
            smallest = min(self._left.values())
            if t + smallest * n / self._rate <= now:
                t += smallest * n / self._rate
                for k in list(self._left):
                    self._left[k] -= smallest
                    if self._left[k] <= 1e-6:  # bytes: float residue of equal-sized frames
                        del self._left[k]
                        if k in self._orphans:
                            self._orphans.discard(k)
                        else:
                            self._done_at[k] = t
            else:
                share = (now - t) * self._rate / n
                for k in self._left:
                    self._left[k] -= share
                t = now
        if t < now:
            self._tokens = min(self.depth, self._tokens + (now - t) * self._rate)
        self._updated = max(self._updated, now)

    async def _serialize(self, nbytes: int) -> float:
        """Put `nbytes` on the link now; returns the time their last byte left."""
        now = self._clock()
        self._advance(now)
        from_burst = min(self._tokens, float(nbytes))
        self._tokens -= from_burst
        if nbytes - from_burst <= 0:
            return now
        frame = next(self._ids)
        self._left[frame] = nbytes - from_burst
        while frame not in self._done_at:
            # sleep until the next departure among the frames in flight; an arrival in between only
            # delays the others (one more share), so waking then and looking again is enough
            next_departure = min(self._left.values()) * len(self._left) / self._rate
            await self._sleep(max(next_departure - (self._clock() - self._updated), 1e-9))
            self._advance(self._clock())
        return self._done_at.pop(frame)

    def occupy(self, nbytes: int) -> None:
        """Bytes that share the link but that nobody waits for (acknowledgements): they take their
        share of the rate from the frames in flight, and burst tokens first."""
        if nbytes < 0:
            raise ValueError(f"cannot transmit a negative number of bytes ({nbytes}).")
        self.bytes += nbytes
        if self._rate is None:
            return
        self._advance(self._clock())
        from_burst = min(self._tokens, float(nbytes))
        self._tokens -= from_burst
        if nbytes - from_burst > 0:
            frame = next(self._ids)
            self._left[frame] = nbytes - from_burst
            self._orphans.add(frame)

    async def transmit(self, nbytes: int, on_sent: Callable[[], object] | None = None) -> None:
        """Wait until a frame of `nbytes` sent now would have arrived: its share of the bandwidth,
        then the latency; `on_sent()` is called when its last byte has left, before the latency."""
        if nbytes < 0:
            raise ValueError(f"cannot transmit a negative number of bytes ({nbytes}).")
        self.bytes += nbytes
        if self._rate is None:
            sent = self._clock()
        else:
            sent = await self._serialize(nbytes)
        if on_sent is not None:
            on_sent()
        wait = sent + self.latency_s - self._clock()
        if wait > 0.0:
            await self._sleep(wait)

    def __repr__(self) -> str:
        bw = "unlimited" if self.bandwidth_bps is None else f"{self.bandwidth_bps / 1e6:g}mbit"
        return f"LinkShaper({bw}, {self.latency_s * 1e3:g}ms)"

"""`swarm trace FILE|DIR ...`: where each peer's frame time went, read from its frame trace
(swarm/net/frame_trace.py; `swarm peer --trace-frames FILE`, `swarm local --trace-frames DIR`).

For a peer whose trace spans S seconds (its first event to its last), and each request it sent
(the events that share a frame number):

    queued       turn - queued      waiting for its turn on the uplink (ordered kinds line up)
    on the wire  sent - turn        the uplink carrying it (with the built-in shaper: until its last
                                    byte left and the one-way latency passed)
    reply        reply - sent       the receiver's downlink and handler, and the reply's way back
    uplink busy  |U [turn, sent]| / S, the union over its requests: the share of the span in which
                                    some request of this peer was on its uplink

and for what it received, the downlink's wait (the `wait` of each arrived event: how long the
emulated downlink held the frame after it was read). Per kind: requests, bytes, and the median,
90th percentile and largest of each phase. A row reads "links busy" directly: a link-bound peer's
uplink is busy near 1; a peer whose uplink idles while its requests wait for replies is waiting
for compute or for another peer.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from .frame_trace import FrameEvent, read_trace

SUFFIX = ".frames.jsonl"


@dataclass(frozen=True)
class Spread:
    """Median, 90th percentile (nearest rank) and largest of some durations, in seconds."""

    median: float
    p90: float
    max: float

    @staticmethod
    def of(values: list[float]) -> Spread:
        if not values:
            return Spread(0.0, 0.0, 0.0)
        ordered = sorted(values)
        def rank(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
        return Spread(rank(0.5), rank(0.9), ordered[-1])


@dataclass(frozen=True)
class KindTimes:
    kind: str
    requests: int
    bytes_out: int
    queued: Spread
    wire: Spread
    reply: Spread


@dataclass(frozen=True)
class PeerTimes:
    name: str
    span_s: float
    uplink_busy: float
    requests_out: int
    bytes_out: int
    requests_in: int
    bytes_in: int
    downlink_wait_s: float
    downlink_wait_max_s: float
    kinds: list[KindTimes]


def covered(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of the intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def peer_times(name: str, events: list[FrameEvent]) -> PeerTimes:
    """The figures above for one peer's events."""
    if not events:
        raise ValueError(f"the trace of {name} holds no frame events; start the peer with --trace-frames FILE "
                         "and let it train a few steps.")
    span = max(e.t for e in events) - min(e.t for e in events)
    requests: dict[int, dict[str, FrameEvent]] = defaultdict(dict)
    for e in events:
        if e.frame is not None:
            requests[e.frame].setdefault(e.event, e)
    by_kind: dict[str, list[dict[str, FrameEvent]]] = defaultdict(list)
    for r in requests.values():
        if "sent" in r and "turn" in r:
            by_kind[r["sent"].kind].append(r)
    def phase(rs: list[dict[str, FrameEvent]], a: str, b: str) -> Spread:
        return Spread.of([r[b].t - r[a].t for r in rs if a in r and b in r])
    kinds = [KindTimes(kind, len(rs), sum(r["sent"].bytes for r in rs), phase(rs, "queued", "turn"),
                       phase(rs, "turn", "sent"), phase(rs, "sent", "reply")) for kind, rs in sorted(by_kind.items())]
    arrived = [e for e in events if e.event == "arrived"]
    waits = [e.wait or 0.0 for e in arrived]
    busy = covered([(r["turn"].t, r["sent"].t) for rs in by_kind.values() for r in rs])
    return PeerTimes(name, span, busy / span if span > 0 else 0.0, sum(k.requests for k in kinds),
                     sum(k.bytes_out for k in kinds), sum(1 for e in events if e.event == "answered"),
                     sum(e.bytes for e in arrived), sum(waits), max(waits, default=0.0), kinds)


def trace_files(paths: list[str]) -> list[Path]:
    """The trace files named, a folder standing for every NAME.frames.jsonl in it."""
    found: list[Path] = []
    for given in map(Path, paths):
        if given.is_dir():
            inside = sorted(given.glob(f"*{SUFFIX}"))
            if not inside:
                raise ValueError(f"{given} holds no *{SUFFIX} files; `swarm local --trace-frames {given}` writes them.")
            found += inside
        elif given.is_file():
            found.append(given)
        else:
            raise ValueError(f"{given} does not exist; name a trace file or the folder given to --trace-frames.")
    return found


def _name(path: Path) -> str:
    return path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.stem


def format_report(peers: list[PeerTimes]) -> str:
    lines = []
    for p in peers:
        lines.append(f"{p.name}: {p.span_s:.1f} s traced, uplink busy {p.uplink_busy:.2f}; sent {p.requests_out} "
                     f"requests ({p.bytes_out / 1e6:.2f} MB), answered {p.requests_in}, received "
                     f"{p.bytes_in / 1e6:.2f} MB; downlink held frames {p.downlink_wait_s:.2f} s in all "
                     f"(longest {p.downlink_wait_max_s * 1e3:.0f} ms)")
        lines.append(f"  {'kind':<10} {'requests':>8} {'MB out':>8}   median / p90 / max, ms: "
                     f"{'queued':<18} {'on the wire':<18} {'reply':<18}")
        for k in p.kinds:
            cells = ["/".join(f"{v * 1e3:.0f}" for v in (s.median, s.p90, s.max)) for s in (k.queued, k.wire, k.reply)]
            lines.append(f"  {k.kind:<10} {k.requests:>8} {k.bytes_out / 1e6:>8.2f}   {'':24}"
                         + " ".join(f"{c:<18}" for c in cells))
    return "\n".join(lines)


def run_trace_report(paths: list[str], json_out: str | None = None) -> int:
    """`swarm trace`: print the report of every trace named; with `json_out`, write it there too."""
    peers = [peer_times(_name(path), read_trace(path)) for path in trace_files(paths)]
    print(format_report(peers))
    if json_out:
        Path(json_out).write_text(json.dumps([asdict(p) for p in peers], indent=1) + "\n")
        print(f"wrote {json_out}")
    return 0

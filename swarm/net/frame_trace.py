"""`FrameTrace`: a peer's timeline of the frames it sends and receives, one JSON line per event, for finding
where a step's time goes (docs/benchmarks.md "Links busy": a trace of this kind found the built-in downlink
charging a large frame for a small one's time). Off unless asked for: `swarm peer --trace-frames FILE`,
`swarm local --trace-frames DIR` (a file per peer).

Events, each {"t": wall-clock seconds, "event", "kind", "peer", "bytes"}, for "arrived" "wait", and for
the events of a request this peer sent (queued, turn, sent, reply, and the reply's arrived) "frame", a
number of its own in this trace, so that they pair up; `swarm trace FILES` (swarm/net/trace_report.py)
says from them where each peer's time went:

    queued    a request is lined up to be sent (ordered kinds take their turn in this order)
    turn      its turn on the uplink began (at once for kinds that are not ordered)
    sent      the shaper let its last byte go and its latency passed (or it was written, unshaped)
    reply     its reply was read
    arrived   a request or a reply was read and passed the downlink; "wait": seconds the downlink held it
    answered  this peer's handler answered a request

Wall-clock times, so that the traces of several peers on one machine line up.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

EVENTS = ("queued", "turn", "sent", "reply", "arrived", "answered")


@dataclass(frozen=True)
class FrameEvent:
    t: float
    event: str
    kind: str
    peer: str
    bytes: int
    wait: float | None = None
    frame: int | None = None


class FrameTrace:
    """Appends `FrameEvent`s to a file as JSON lines, each written whole (line-buffered)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", buffering=1, encoding="utf-8")

    def note(self, event: str, kind: str, peer: str, nbytes: int, wait: float | None = None,
             frame: int | None = None) -> None:
        row = {"t": round(time.time(), 6), "event": event, "kind": kind, "peer": peer, "bytes": nbytes}
        if wait is not None:
            row["wait"] = round(wait, 6)
        if frame is not None:
            row["frame"] = frame
        if not self._file.closed:
            self._file.write(json.dumps(row, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.close()


def read_trace(path: str | Path) -> list[FrameEvent]:
    """The events of a trace file, in the order written (a last line cut off by a crash is left out)."""
    events = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        events.append(FrameEvent(row["t"], row["event"], row["kind"], row["peer"], row["bytes"], row.get("wait"),
                                 row.get("frame")))
    return events

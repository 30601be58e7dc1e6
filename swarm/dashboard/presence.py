"""`Presence`: which of the peers the DHT lists are there, and the offline rows of those that went.

The DHT lists a peer as long as its records live (up to its ttl after it died). The dashboard
probes every listed peer every ~2 s (`swarm/monitor/liveness.py`); `Presence` keeps the
verdicts and turns the rows built from the records into the rows shown:

- a listed peer that missed `MISSES_OFFLINE` probes in a row is shown "offline" at once (not
  online, no tokens/s), although its records still live; it is back as its records say as
  soon as it answers again;
- a peer whose records expired is shown as an "offline" row with its last known figures;
- an offline row is shown for `OFFLINE_KEEP_S` after the peer went offline (its second missed
  probe, or the expiry of its records, whichever came first), then dropped: a dead peer whose
  records still live stays hidden, and stays offline, until it answers again.

Rows gain `answers`: true (answered the last probe), false (missed it), null (not probed yet).
Time comes from `clock` (monotonic seconds), so that tests can drive it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

MISSES_OFFLINE = 2  # missed probes in a row that make a listed peer offline
OFFLINE_KEEP_S = 60.0  # an offline row is shown this long after its peer went offline


@dataclass
class _Peer:
    view: dict  # the last row built from its records
    seen: float = 0.0  # clock time of that row
    misses: int = 0  # probes missed in a row
    probed: bool = False
    offline_since: float | None = None


def _offline(view: dict, age_s: float) -> dict:
    return {**view, "state": "offline", "online": False, "tokens_per_s": 0.0, "standby": False,
            "measured_tokens_per_s": None, "age_s": round(age_s, 1)}


class Presence:
    def __init__(self, clock: Callable[[], float] = time.monotonic, misses: int = MISSES_OFFLINE,
                 keep_s: float = OFFLINE_KEEP_S) -> None:
        self.clock, self.misses, self.keep_s = clock, misses, keep_s
        self._peers: dict[str, _Peer] = {}

    def probed(self, peer: str, answered: bool) -> None:
        """Take one probe's verdict on `peer`."""
        entry = self._peers.get(peer)
        if entry is None:
            return  # no longer listed: nothing to show either way
        entry.probed = True
        entry.misses = 0 if answered else entry.misses + 1

    def dead(self, peer: str) -> bool:
        entry = self._peers.get(peer)
        return entry is not None and entry.misses >= self.misses

    def rows(self, views: list[dict]) -> list[dict]:
        """The rows to show, from `views` (one per peer with live records, built from them)."""
        now = self.clock()
        shown = []
        for view in views:
            entry = self._peers.setdefault(view["peer_id"], _Peer(view))
            view = {**view, "answers": entry.misses == 0 if entry.probed else None}
            entry.view, entry.seen = view, now
            if entry.misses < self.misses:
                entry.offline_since = None
                shown.append(view)
                continue
            if entry.offline_since is None:
                entry.offline_since = now
            if now - entry.offline_since < self.keep_s:
                shown.append(_offline(view, view["age_s"]))
        listed = {v["peer_id"] for v in views}
        for peer in sorted(p for p in self._peers if p not in listed):
            entry = self._peers[peer]
            if entry.offline_since is None:
                entry.offline_since = entry.seen  # its records expired since the last sample
            if now - entry.offline_since >= self.keep_s:
                del self._peers[peer]
            else:
                shown.append(_offline(entry.view, entry.view["age_s"] + now - entry.seen))
        return shown

"""`HealthBook`: the dashboard's verified view of the swarm's health records.

Everything read from the DHT is untrusted. The book keeps, per peer id, the newest record
that parses, verifies (`swarm.monitor.health.parse_health`) and belongs to the run, and ignores
the rest, counting each distinct bad entry once (an entry sits in the DHT until it
expires and is read on every poll; counting it every time would make the counter a clock).

A record is signed by the libp2p key its peer id is derived from (`parse_health`), so no
key needs pinning here: a record for a peer id signed by anyone else never verifies. In a
private swarm the book also refuses records without a valid ticket (`policy`).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass

import msgpack

from swarm.dht import RecordError
from swarm.monitor.health import SignedHealth, parse_health
from swarm.trust.admission import AdmissionPolicy

MAX_REMEMBERED_BAD = 4096  # digests of bad entries already counted
MAX_PROBLEMS = 20  # the last reasons, shown on the page


@dataclass
class _Entry:
    signed: SignedHealth
    expires: float  # DHT time


def _digest(subkey: object, value: object, expires: object) -> bytes:
    try:
        packed = msgpack.packb([subkey, value, expires], use_bin_type=True)
    except (TypeError, ValueError, OverflowError):  # not re-packable as it came: its repr still names it
        packed = repr((subkey, value, expires)).encode("utf-8", "replace")
    return hashlib.sha256(packed).digest()


class HealthBook:
    def __init__(self, run_hash: str, policy: AdmissionPolicy | None = None) -> None:
        self.run_hash = run_hash
        self.policy = policy or AdmissionPolicy()
        self.invalid = 0  # distinct bad entries seen
        self.problems: deque[str] = deque(maxlen=MAX_PROBLEMS)
        self._entries: dict[str, _Entry] = {}
        self._bad: OrderedDict[bytes, None] = OrderedDict()

    def _known_bad(self, digest: bytes) -> bool:
        if digest in self._bad:
            self._bad.move_to_end(digest)
            return True
        return False

    def _count_bad(self, digest: bytes, problem: str) -> None:
        self._bad[digest] = None
        if len(self._bad) > MAX_REMEMBERED_BAD:
            self._bad.popitem(last=False)
        self.invalid += 1
        self.problems.append(problem)

    def update(self, raw: list[tuple[object, object, float]], now: float) -> None:
        """Take in one poll's raw entries (subkey, value, expiration); drop what has expired."""
        self._entries = {p: e for p, e in self._entries.items() if e.expires > now}
        for subkey, value, expires in raw:
            digest = _digest(subkey, value, expires)
            if self._known_bad(digest):
                continue  # once judged bad, an entry stays bad
            try:
                signed = parse_health(subkey, value, expires, self.policy, now)
                record = signed.record
                if record.run_hash != self.run_hash:
                    raise RecordError(f"the health record of {record.peer_id[-8:]} belongs to run {record.run_hash}.")
            except RecordError as e:
                self._count_bad(digest, str(e))
                continue
            known = self._entries.get(record.peer_id)
            if known is not None and known.signed.record.timestamp > record.timestamp:
                continue  # an older record than the one we hold (a replay, or a slow DHT node)
            self._entries[record.peer_id] = _Entry(signed, expires)

    def live(self) -> dict[str, SignedHealth]:
        return {peer: e.signed for peer, e in self._entries.items()}

    def key_of(self, peer_id: str) -> str | None:
        """Short name of the libp2p key that signs this peer's records."""
        entry = self._entries.get(peer_id)
        return entry.signed.fingerprint if entry else None

"""`SnapshotStore`: the stage snapshots one peer holds, in memory, checked and bounded.

A snapshot is a stage's serialised `StageRunner.state_dict()` at a step boundary (the stage
has applied exactly `step` steps) with the sha256 of its bytes. A peer holds its own stage's
last snapshots (so that a rollback needs no download) and, as a custodian, copies of other
stages' (so that a stage whose every replica died can be restored: peer/state/snapshots.py).

Bounds: per stage at most `keep` snapshots, the newest steps; none larger than `max_bytes(stage)`.
So a peer holds at most `keep` x the sizes of the stages it keeps, whoever offers what.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from protocol.snapshot_wire import SnapshotInfo


class SnapshotRefused(ValueError):
    """A snapshot that is not kept; the text says why."""


@dataclass(frozen=True)
class Snapshot:
    stage: int
    step: int
    sha256: str
    data: bytes

    @property
    def info(self) -> SnapshotInfo:
        return SnapshotInfo(self.step, self.sha256, len(self.data))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class SnapshotStore:
    def __init__(self, max_bytes: Callable[[int], int], keep: int = 2) -> None:
        if keep < 1:
            raise ValueError("a snapshot store keeps at least one snapshot per stage.")
        self.max_bytes, self.keep = max_bytes, keep
        self._held: dict[int, dict[int, Snapshot]] = {}  # stage -> step -> snapshot

    def put(self, snap: Snapshot) -> bool:
        """Keep `snap` if its bytes match its sha256 and it is among the `keep` newest of its
        stage; True if kept (the oldest beyond `keep` is dropped). A snapshot already held at
        that step is kept as it was: a second, different one for the same step is refused."""
        if len(snap.data) > self.max_bytes(snap.stage):
            raise SnapshotRefused(f"a snapshot of stage {snap.stage} of {len(snap.data)} bytes is larger than "
                                  f"that stage's state can be.")
        if sha256_hex(snap.data) != snap.sha256:
            raise SnapshotRefused(f"the snapshot of stage {snap.stage} at step {snap.step} does not match its sha256.")
        held = self._held.setdefault(snap.stage, {})
        if snap.step in held:
            if held[snap.step].sha256 != snap.sha256:
                raise SnapshotRefused(f"another snapshot of stage {snap.stage} at step {snap.step} is held already.")
            return True
        if len(held) >= self.keep and snap.step < min(held):
            return False  # older than everything kept
        held[snap.step] = snap
        while len(held) > self.keep:
            del held[min(held)]
        return True

    def drop_after(self, step: int) -> int:
        """Drop every stage's snapshots of steps after `step` (the swarm rolled back to it: those
        steps are driven again and snapshotted anew); returns how many were dropped."""
        dropped = 0
        for held in self._held.values():
            for t in [t for t in held if t > step]:
                del held[t]
                dropped += 1
        return dropped

    def wants(self, stage: int, step: int) -> bool:
        """Whether a snapshot of `stage` at `step` would be kept (and is not held already)."""
        held = self._held.get(stage, {})
        return step not in held and (len(held) < self.keep or step > min(held))

    def get(self, stage: int, step: int) -> Snapshot | None:
        return self._held.get(stage, {}).get(step)

    def newest(self, stage: int) -> Snapshot | None:
        held = self._held.get(stage, {})
        return held[max(held)] if held else None

    def listed(self, stage: int) -> list[SnapshotInfo]:
        """What is held of `stage`, newest first."""
        held = self._held.get(stage, {})
        return [held[s].info for s in sorted(held, reverse=True)]

    def stages(self) -> list[int]:
        return sorted(s for s, held in self._held.items() if held)

    @property
    def nbytes(self) -> int:
        return sum(len(s.data) for held in self._held.values() for s in held.values())

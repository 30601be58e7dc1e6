"""`StepLog`: what the leading head reports of each step it drove, and `AttemptFailed`, an attempt
that did not complete and is re-driven (peer/step/driver.py); `PartClock` and `timed`, which time the
parts of a step's commit for it."""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class StepLog:
    step: int  # 1-based: the number of optimizer steps done after this one
    loss: float
    tokens: int
    seconds: float
    basis_version: int
    lr: float
    attempts: int = 1  # 1 + the attempts that failed and were re-driven
    commit_seconds: float = 0.0  # the successful attempt's commit (replicas' reduce and apply)
    sync_bytes: int = 0  # what this head's replica sent to the other heads in that reduce
    skipped: bool = False  # fp16: some stage overflowed, so no stage stepped its optimizer
    loss_scale: float = 1.0  # fp16: the loss scale after this step (1 without loss scaling)
    heads: dict[str, int] = field(default_factory=dict)  # microbatches each head computed (peer/commit/head_work.py)
    # seconds of the commit by part: "reduce" (until every replica's reply is in), "checks" (the spot checks),
    # "apply" (this head's own); "own_*": this head's own reduce, from its record check to its finish
    commit_parts: dict[str, float] = field(default_factory=dict)


class AttemptFailed(RuntimeError):
    """One attempt at a step did not complete; the step is re-driven. `peer`: the peer it names (one that
    refused a message, stopped answering or was caught), if any (peer/step/redrive_cause.py); `evidence`: where
    that peer signed its refusal of the leader's reduce, the encoded `RefusalReport` (protocol/refusal.py)."""

    def __init__(self, reason: str = "", peer: str | None = None, evidence: bytes = b"") -> None:
        super().__init__(reason)
        self.peer, self.evidence = peer, evidence


class PartClock:
    """Seconds between named marks: `start()`, then `mark(part)` as each part ends."""

    def __init__(self) -> None:
        self._marks: list[tuple[str, float]] = []

    def start(self) -> None:
        self._marks = [("", time.perf_counter())]

    def mark(self, part: str) -> None:
        self._marks.append((part, time.perf_counter()))

    def parts(self, prefix: str = "") -> dict[str, float]:
        return {prefix + part: t - before for (_, before), (part, t) in zip(self._marks, self._marks[1:])}


@contextmanager
def timed(parts: dict[str, float], name: str) -> Iterator[None]:
    """parts[name] = the seconds the block took."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        parts[name] = time.perf_counter() - t0

"""`RedriveCause`: why the leading head keeps re-driving one step, named and acted on (issue 56, item 4).

A step whose attempts fail is re-driven with a growing back-off (`StepDriver.train_step`). Once `after`
attempts of one step have failed, the head names the cause, in one log line per step and again every
`after` failures while it lasts:

    culprit = the peer named by the most failed attempts of the step (the peer that refused a message,
              stopped answering, or was caught), if at least half of them name it

and acts on it: the culprit is reported to the directory, so that routers avoid it and the next attempt
goes around it where its stage has another live replica; where it is its stage's only live replica the
line says that the swarm waits for that stage (a replica behind the swarm downloads the state or restores
a snapshot, and the swarm rolls back: peer/state/). With no peer named, the line lists the reasons seen.
A stranger's refusals thus cost the step `after` attempts, not every attempt for the rest of the run.
Where the culprit signed its refusal of the head's reduce command (a head that refused the head's step
record: protocol/refusal.py), the diagnosis carries the newest such evidence, which the head sends the
coordinator (`StepDriver.report_refusal`): the coordinator, not the head's word, decides whether it is banned
for the run (swarm/replicas/refusal_verdict.py).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

AFTER = 3  # failed attempts of one step before the head names the cause


@dataclass
class Failure:
    attempt: int
    reason: str
    peer: str | None = None  # the peer the failure names, if any
    evidence: bytes = b""  # its signed refusal of the head's reduce, as a RefusalReport (protocol/refusal.py)


@dataclass
class Diagnosis:
    step: int  # counted from 1, as logs say
    failures: int
    culprit: str | None
    named: int  # failed attempts that name the culprit
    reasons: list[str] = field(default_factory=list)  # the distinct reasons, most frequent first
    evidence: bytes = b""  # the culprit's newest signed refusal among them, if any


class RedriveCause:
    def __init__(self, after: int = AFTER) -> None:
        self.after = after
        self.step: int | None = None
        self.failures: list[Failure] = []

    def note(self, step: int, failure: Failure) -> Diagnosis | None:
        """Record a failed attempt of `step` (0-based); a Diagnosis when the head should name the cause now."""
        if step != self.step:
            self.step, self.failures = step, []
        self.failures.append(failure)
        if len(self.failures) % self.after:
            return None
        named = Counter(f.peer for f in self.failures if f.peer)
        culprit, count = named.most_common(1)[0] if named else (None, 0)
        if count * 2 < len(self.failures):
            culprit, count = None, 0
        reasons = [r for r, _ in Counter(f.reason for f in self.failures
                                         if culprit is None or f.peer == culprit).most_common()]
        evidence = next((f.evidence for f in reversed(self.failures) if f.peer == culprit and f.evidence), b"")
        return Diagnosis(step + 1, len(self.failures), culprit, count, reasons, evidence if culprit else b"")


def describe(d: Diagnosis, stage: int | None, others: int) -> str:
    """The log line of a diagnosis; `stage`: the culprit's stage (None: unknown), `others`: its stage's other live
    replicas."""
    said = "; ".join(f"'{r}'" for r in d.reasons[:3])
    head = f"step {d.step} failed {d.failures} attempts"
    if d.culprit is None:
        return f"{head}, for reasons that name no single peer: {said}"
    who = f"peer {d.culprit[-8:]}" + ("" if stage is None else f" of stage {stage}")
    if stage is None or others > 0:
        where = "" if stage is None else f" ({others} other live replica{'s' if others != 1 else ''} of stage {stage})"
        return f"{head}, {d.named} of them because of {who} ({said}): routing around it{where}"
    return (f"{head}, {d.named} of them because of {who} ({said}); it is stage {stage}'s only live replica: the "
            f"swarm waits for that stage to catch up (a replica behind downloads the state or restores a snapshot, "
            f"and the swarm rolls back)")

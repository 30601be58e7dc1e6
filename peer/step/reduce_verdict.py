"""What the leading head reads from every replica's reply to a reduce (`StepDriver`'s commit, peer/step/driver.py).

A step may be applied only if every stage reduced: each stage has a replica that answered "ok", and all of a
stage's replicas that did summed the same contributions (the same replicas, each with the same microbatches).
Stage 0's contributions must also be the shares the heads were given (peer/commit/head_work.py). Anything else
fails the attempt (`AttemptFailed`), which the driver re-drives; a stage that did not reduce because one of its
replicas refused the command names that replica (the head heard it refuse), and where that replica signed its
refusal of the command's step record, `refusal_evidence` makes it the evidence the coordinator judges
(protocol/refusal.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from peer.daemon.step_log import AttemptFailed
from protocol.control import CommandReply
from protocol.refusal import RefusalReport


@dataclass
class ReduceVerdict:
    """A reduce every stage agreed on, read from its replies."""

    appliers: list[str]  # replicas that reduced: each is told to apply the step
    named: list[str]  # of those, the ones whose contribution was summed
    workers: dict[int, list[str]]  # stage -> replicas whose contribution held microbatches
    shares: dict[int, dict[str, list[int]]]  # stage -> each summed replica's microbatches
    overflowed: list[int]  # fp16: stages whose share overflowed (the step is skipped everywhere)
    # (step, stage -> sha256) when every stage's replicas agree on their newest snapshot, all at one step
    snapshots: tuple[int, dict[int, str]] | None


def _refuser(replies: dict[str, CommandReply]) -> str | None:
    """The one replica of a stage that refused the reduce command itself, as the leading head heard from it: its
    own reply failed for a reason that names no other replica, and two replies at least (the others' failures
    then come from it: "replica X took no part"). None where that is not one replica (peer/step/redrive_cause.py)."""
    own = [p for p, r in replies.items() if r.outcome != "ok"
           and not any(q[-8:] in (r.reason or "") for q in replies if q != p)]
    return own[0] if len(own) == 1 and len(replies) > 1 else None


def refusal_evidence(run: str, record: bytes, refuser: str | None, replies: dict[str, CommandReply]) -> bytes:
    """The encoded `RefusalReport` of `refuser`'s signed refusal of the reduce that carried `record`; b"" where
    there is none (no refuser named, no signature in its reply, or no record: a swarm without a coordinator)."""
    reply = replies.get(refuser) if refuser else None
    if reply is None or not reply.refusal or not record:
        return b""
    return RefusalReport(run, refuser, record, reply.reason, reply.refusal).encode()


def judge_reduce(replies: dict[str, CommandReply], members: dict[str, int], n_stages: int,
                 head_shares: dict[str, list[int]]) -> ReduceVerdict:
    """The verdict on a reduce from every replica's reply (`members`: peer -> stage), or AttemptFailed if a stage
    did not reduce, its replicas summed different contributions, or stage 0's are not `head_shares`."""
    appliers, named, workers, snapshots, overflowed, shares = [], [], {}, {}, [], {}
    for stage in range(n_stages):
        oks = {p: r for p, r in replies.items() if members[p] == stage and r.outcome == "ok"}
        if not oks:
            here = {p: r for p, r in replies.items() if members[p] == stage}
            why = "; ".join(f"{p[-8:]}: {r.reason or r.outcome}" for p, r in here.items())
            raise AttemptFailed(f"no replica of stage {stage} reduced ({why or 'none answered'})", _refuser(here))
        agreed = {tuple(sorted((p, tuple(m)) for p, m in r.contributors.items())) for r in oks.values()}
        if len(agreed) != 1:
            raise AttemptFailed(f"the replicas of stage {stage} summed different contributions")
        summed = next(iter(agreed))
        appliers += list(oks)
        named += [p for p in oks if p in dict(summed)]  # reduced, and its contribution summed
        workers[stage] = sorted(p for p, mbs in summed if mbs)
        shares[stage] = {p: list(mbs) for p, mbs in summed}
        claims = {r.snapshot for r in oks.values()}
        if len(claims) == 1 and None not in claims:  # the stage's replicas agree on their newest snapshot
            snapshots[stage] = claims.pop()
        overflowed += [stage] if any(r.overflow for r in oks.values()) else []
    if {p: m for p, m in shares[0].items() if m} != {p: m for p, m in head_shares.items() if m}:
        raise AttemptFailed("stage 0's contributions are not the shares the heads were given")
    steps = {step for step, _ in snapshots.values()}
    at_one_step = None
    if len(snapshots) == n_stages and len(steps) == 1:  # every stage's snapshot at one step
        at_one_step = (steps.pop(), {s: sha for s, (_, sha) in snapshots.items()})
    return ReduceVerdict(appliers, named, workers, shares, overflowed, at_one_step)

"""`ReduceSeats`: which members of a stage sit in a step's reduce (issue 57, item 5: a seat by measured work).

Every replica sends its whole contribution to every member it reduces with, so a member costs its stage's
uplinks the same whether it worked or not: an id that answers the leader's commands and reduces an empty
contribution (a "bare" id: no GPU, one proof of work) cost as much as a replica, and with more than
`MAX_GROUP` (64) members a stage's reduce command could not be sent at all, so no step committed. The
leading head seats, per stage s at step t,

    seats_s = H ∪ L ∪ P ∪ D_s,   at most `max_group`
    H: the members that hold the attempt's work (a status reply at step t listing microbatches done): always,
       since every microbatch must be in some contribution (else the sum is refused and the step re-driven)
    L: stage 0 only: the heads the leader lease names (each did checked work to be named), and the leader
    P: the proven: members that did a step's work (`ReduceVerdict.workers`) in the last `PROVEN_STEPS` steps
       this head committed, most recent first
    D: up to `probation` other members at step t, ranked by sha256(record | t | attempt | peer id), which nobody
       knows before the step's record is signed: a newcomer's way in beside the microbatches routers give it

only where the stage has more members than H ∪ L ∪ P ∪ D could hold (no status query then: every member is
seated, as before, in a swarm without idle strangers), and every member up to `max_group` on this head's
first commit as leader (it remembers no work yet). So K bare ids on a stage cost what `probation` of them
do, however large K. A member left out is told the step's apply (peer/commit/commit.py): it holds no sum of
the step, so it knows the swarm went on without it and catches up (swarm/replicas/own_state.py, `BehindCheck`).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from peer.daemon.step_log import AttemptFailed
from protocol.control import MAX_GROUP, CommandReply

from .commands import UNREACHABLE

log = logging.getLogger(__name__)

PROVEN_STEPS = 50  # a member that did a step's work within this many committed steps keeps its seat
PROBATION_SEATS = 4  # members per stage seated beyond those that work: what idle ids may cost a stage
STATUS_TIMEOUT_S = 5.0  # how long the leader waits for a member's status before leaving it out of the step

Status = Callable[[str, int, int], Awaitable[CommandReply]]  # (peer, step, attempt) -> its status reply


@dataclass
class Seating:
    """One attempt's seats: stage -> the members that reduce, and who was left out (each told the apply)."""

    groups: dict[int, list[str]]
    left_out: dict[str, int] = field(default_factory=dict)  # member -> stage: answered at the step, not seated
    unreachable: list[str] = field(default_factory=list)  # members never seen working that no command reaches


class ReduceSeats:
    def __init__(self, leader: str, max_group: int = MAX_GROUP, probation: int = PROBATION_SEATS,
                 proven_steps: int = PROVEN_STEPS) -> None:
        self.leader, self.max_group, self.probation, self.proven_steps = leader, max_group, probation, proven_steps
        self.worked: dict[str, int] = {}  # member -> the last step (steps done) whose work it did, as committed here
        self.committed = 0  # steps this head committed as leader: none means no memory of who works
        self._left: dict[int, int] = {}  # stage -> how many members its last seating left out (logged on a change)

    def remember(self, steps_done: int, workers: dict[int, list[str]]) -> None:
        """After a commit: who did the step's work (`ReduceVerdict.workers`)."""
        self.committed += 1
        for peers in workers.values():
            for p in peers:
                self.worked[p] = steps_done
        self.worked = {p: s for p, s in self.worked.items() if steps_done - s < self.proven_steps}

    def forget(self) -> None:
        """This head stopped leading: what it knew of who works is not the new leader's to trust."""
        self.worked, self.committed = {}, 0

    def _kept(self, stage: int, members: list[str], lease: list[str]) -> list[str]:
        """L ∪ P of `members`: lease heads and the leader first (stage 0), then the proven, most recent first."""
        heads = [p for p in [self.leader, *lease] if p in members] if stage == 0 else []
        proven = sorted((p for p in members if p in self.worked), key=lambda p: (-self.worked[p], p))
        return list(dict.fromkeys(heads + proven))

    def needs_status(self, stage: int, members: list[str], lease: list[str]) -> bool:
        """Whether some member of `stage` may be left out, so the leader must ask who holds the attempt's work."""
        if not self.committed:
            return len(members) > self.max_group
        return len(members) > min(self.max_group, len(self._kept(stage, members, lease)) + self.probation)

    def choose(self, stage: int, members: list[str], replies: dict[str, CommandReply], attempt: int,
               lease: list[str], draw_key: bytes) -> tuple[list[str], list[str]]:
        """(seats, left out) of a stage whose members' status replies are `replies`; AttemptFailed if the
        members that hold the attempt's work are more than `max_group`."""
        ok = {p for p, r in replies.items() if r.outcome == "ok"} | {self.leader} & set(members)
        holders = sorted(p for p in ok if p != self.leader and replies[p].microbatches
                         and replies[p].attempt == attempt)
        if len(holders) > self.max_group:
            raise AttemptFailed(f"{len(holders)} replicas of stage {stage} hold the attempt's work, more than a "
                                f"reduce seats ({self.max_group})")
        seats = list(dict.fromkeys(holders + [p for p in self._kept(stage, members, lease) if p in ok]))
        rest = sorted((p for p in ok if p not in seats),
                      key=lambda p: hashlib.sha256(draw_key + attempt.to_bytes(4, "big") + p.encode()).digest())
        room = self.max_group - len(seats) if not self.committed else min(self.probation, self.max_group - len(seats))
        seats = sorted(seats[:self.max_group] + rest[:max(0, room)])
        return seats, sorted(p for p in ok if p not in seats)

    async def seat(self, members: dict[str, int], step: int, attempt: int, status: Status, lease: list[str],
                   draw_key: bytes) -> Seating:
        """The attempt's seats for every stage (`members`: peer -> stage), asking the status of a stage's members
        only where some may be left out."""
        by_stage: dict[int, list[str]] = {}
        for p, s in sorted(members.items()):
            by_stage.setdefault(s, []).append(p)
        seating = Seating({})
        key = draw_key + step.to_bytes(8, "big")  # the step too: a swarm without a coordinator signs no record
        crowded = {s for s, peers in by_stage.items() if self.needs_status(s, peers, lease)}
        asked = [p for s in crowded for p in by_stage[s] if p != self.leader]  # every crowded stage's at once: one
        replies = dict(zip(asked, await asyncio.gather(*(status(p, step, attempt) for p in asked))))  # round trip
        for stage, peers in sorted(by_stage.items()):
            if stage not in crowded:
                seating.groups[stage], self._left[stage] = peers, 0
                continue
            seating.unreachable += [p for p in peers if p in replies and replies[p].reason.startswith(UNREACHABLE)
                                    and p not in self.worked]  # an id that never worked here and nobody reaches
            seats, left_out = self.choose(stage, peers, {p: replies[p] for p in peers if p in replies}, attempt,
                                          lease, key)
            seating.groups[stage] = seats
            seating.left_out.update({p: stage for p in left_out})
            if len(left_out) != self._left.get(stage, 0):
                log.info("step %d: stage %d seats %d of its %d members in the reduce (those that work lately, and %d "
                         "more: --probation-seats); %d left out are told the step's apply and catch up by themselves",
                         step + 1, stage, len(seats), len(peers), self.probation, len(left_out))
            self._left[stage] = len(left_out)
        return seating

"""`SpotChecks`: the leading head's side of verified contributions (issue 21; the replica's side
is peer/checks/share_check.py, the records protocol/spot_check.py).

After every stage's replicas have reduced, and before anything is applied:

1. **Blame.** A replica whose contribution another replica refused (NaN, a wrong size, tensors
   without microbatches) or that withheld it is named in that replica's reduce reply (`blame`);
   the reduce failed. The leader convicts a replica blamed by a majority of the other replicas
   of its stage that replied.
2. **Spot checks.** Each replica's share of the step (its microbatches' gradient sum) is
   recomputed, with probability `rate` (drawn here, after the contributions are in, so nobody
   knows ahead which share) or always if its stage's replicas name it a suspect (a share far
   from the rest, peer/checks/robust_sum.py), by another replica of its stage picked at random, from the inputs
   whose digests the SENDERS reported in their reduce replies. On a mismatch a third replica
   recomputes it: two of three computations convict the one they disagree with (the replica
   checked, or its checker). A check that finds nothing either way (the replica checked could not
   be reached) fails the attempt without a ban; a share drawn once is checked again at every retry
   of its step, and the third such check in a row convicts (it withholds its inputs).
3. **Two replicas, no third.** A mismatch or a mutual blame between the only two replicas of a
   stage cannot say who lied. The step is not applied with the doubtful work: the attempt fails,
   and the replica the leader saw later is banned, its share re-driven on the other. (A liar that
   has served longer than an honest newcomer keeps its place: with a third replica, checks settle
   by two of three instead.)

A convicted replica is banned for the run here and, through the leader's next abort, everywhere;
the attempt is re-driven without it, so the liar's work is thrown out and redone and the run still
equals the one-process run. Checks cover exact replica sync (`powersgd`'s error feedback is each
replica's own and cannot be recomputed) and every stage.

4. **Heads.** Every head computes a share of stage 0 (peer/step/head_work.py), so a head's share is
   drawn like any other's (the leader's own is not: it is the swarm's trusted driver) and the
   leader recomputes it itself (peer/checks/share_check.py `recompute_head_share`): the tokens it
   regenerates, the activations the head sent as the stage-1 replicas that took them report them,
   the gradients as their senders report them. The leader's verdict needs no third computation.
5. **Sender against receiver.** A boundary activation is reported twice, by its sender ("a") and
   by its receiver ("r"). Where the two differ and the sender is not the leader, nothing can say
   which of them lies: as in item 3, the step is not applied and the later of the two is banned.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from peer.daemon.step_log import AttemptFailed
from protocol.control import Command, CommandReply
from protocol.spot_check import DIGEST_BYTES, CheckOrder, Sent, encode_order

log = logging.getLogger(__name__)

Send = Callable[..., Awaitable[CommandReply]]  # (peer, command[, timeout])
UNCHECKED = "unchecked: "  # a check that found nothing either way


class SpotChecks:
    def __init__(self, run_hash: str, n_stages: int, rate: float, send: Send, ban: Callable[[str], None],
                 exact: bool = True, rng: random.Random | None = None, leader: str = "",
                 check_timeout: float | None = None) -> None:
        self.run_hash, self.n_stages, self.rate, self.exact = run_hash, n_stages, rate, exact
        self.check_timeout = check_timeout  # how long a check may take (None: the sender's default)
        self.leader = leader  # this leading head: its word is the run's, it checks the other heads' shares
        self.send, self.ban = send, ban
        self.rng = rng or random.SystemRandom()  # drawn where no replica can predict it
        self.first_seen: dict[str, float] = {}
        self._drawn: tuple[int, set[str]] = (-1, set())  # (step, shares drawn): a retry of the step checks them again
        self._unchecked: dict[str, int] = {}  # replica -> checks of it in a row that could not run
        self.convicted: list[str] = []  # banned for the run, newest last: every abort names them
        self.reasons: dict[str, str] = {}  # why each was banned: the leader tells the banned replica (step/driver.py)
        self.checks = self.mismatches = 0
        self.checkable = 0  # shares that could be drawn: work done, and another replica of the stage to check it

    def seen(self, peers: list[str]) -> None:
        now = time.monotonic()
        for p in peers:
            self.first_seen.setdefault(p, now)

    # ------------------------------------------------------------------ 1. blame in reduce replies
    def judge_blame(self, replies: dict[str, CommandReply], members: dict[str, int]) -> None:
        """Convict (and raise AttemptFailed) on the blame in a failed reduce's replies."""
        for stage in range(self.n_stages):
            peers = [p for p in replies if members.get(p) == stage]
            blamed = {p: [q for q in peers if p in replies[q].blame and q != p] for p in peers}
            for p, by in blamed.items():
                others = len(peers) - 1
                if not by:
                    continue
                if 2 * len(by) > others and not (others == 1 and by[0] in replies[p].blame):
                    self._convict(p, f"blamed by {len(by)} of the {others} other replicas of stage {stage}: "
                                     f"{replies[by[0]].reason}")
                elif others == 1:
                    self._dispute(p, by[0], stage, "they blame each other")

    # ------------------------------------------------------------------ 2. recomputation
    async def run(self, step: int, attempt: int, members: dict[str, int], replies: dict[str, CommandReply],
                  shares: dict[int, dict[str, list[int]]], own_sent: list[Sent]) -> None:
        """Draw and run this attempt's checks; raise AttemptFailed if a replica is convicted or a
        dispute leaves doubtful work (`shares`: stage -> replica -> its microbatches, as agreed)."""
        if not self.exact or self.rate <= 0:
            return
        sent = [(p, s) for p, r in replies.items() for s in r.sent] + [("", s) for s in own_sent]
        jobs = []
        for stage in range(self.n_stages):
            oks = [p for p, r in replies.items() if members.get(p) == stage and r.outcome == "ok"]
            if stage == 0 and self.leader not in oks:  # heads: the leader checks them (item 4)
                oks = []
            # a share far from the rest (robust_sum.py, as the stage's replicas agree) is checked whatever the draw
            far = {p for q in oks for p in replies[q].suspects}
            if self._drawn[0] != step:
                self._drawn = (step, set())
            for target, mbs in shares.get(stage, {}).items():
                if not mbs or len(oks) < 2 or stage == 0 and target == self.leader:
                    continue
                self.checkable += 1
                if target not in far | self._drawn[1] and self.rng.random() >= self.rate:
                    continue
                self._drawn[1].add(target)  # drawn: checked at every retry of this step, a dodge included
                order = self._order(target, mbs, stage, sent, members)
                checkers = [self.leader] if stage == 0 else [p for p in oks if p != target]
                if order is not None:
                    jobs.append(self._check(step, attempt, stage, order, checkers))
        for outcome in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome

    def _order(self, target: str, mbs: list[int], stage: int, sent: list[tuple[str, Sent]],
               members: dict[str, int]) -> CheckOrder | None:
        """The inputs of `target`'s share, as its senders reported them (a head's: as stage 1 reported
        what it sent on and what it got back); None if one did not."""
        def digest_of(kind: str, mb: int, from_stage: int) -> bytes | None:
            found = {s.digest for p, s in sent if s.kind == kind and s.microbatch == mb and s.to == target
                     and members.get(p, 0) == from_stage}
            return found.pop() if len(found) == 1 else None

        def said(by: str, kind: str, mb: int, about: str) -> set[bytes]:
            return {s.digest for p, s in sent if (p or self.leader) == by and s.kind == kind and s.microbatch == mb
                    and s.to == about}
        if self.n_stages == 1:  # a one-stage swarm's head: its only input is the tokens, which the checker regenerates
            return CheckOrder(target, list(mbs), [(bytes(DIGEST_BYTES), None)] * len(mbs))
        inputs = []
        for mb in mbs:
            if stage == 0:  # a head's input is the tokens (regenerated); what it sent on, as its receiver saw it
                a, g = digest_of("r", mb, 1), digest_of("g", mb, 1)
                ends = {(target, q) for q, s in sent if s.kind == "r" and s.microbatch == mb and s.to == target}
            else:
                a = digest_of("a", mb, stage - 1)
                g = digest_of("g", mb, stage + 1) if stage < self.n_stages - 1 else None
                ends = {(p or self.leader, target) for p, s in sent if s.kind == "a" and s.microbatch == mb
                        and s.to == target}
            for sender, receiver in sorted(ends):  # item 5: the two ends of one activation disagree
                out, seen = said(sender, "a", mb, receiver), said(receiver, "r", mb, sender)
                if out and seen and not out & seen and sender != self.leader:
                    self._dispute(sender, receiver, stage, f"they report different bytes for microbatch {mb}")
            if a is None or (stage < self.n_stages - 1 and g is None):
                log.info("step check skipped: microbatch %d's inputs to %s were not reported by their sender",
                         mb, target[-8:])
                return None
            inputs.append((a, g))
        return CheckOrder(target, list(mbs), inputs)

    async def _check(self, step: int, attempt: int, stage: int, order: CheckOrder, others: list[str]) -> None:
        """Check one share; settle a mismatch with a third replica (AttemptFailed if someone lied)."""
        self.checks += 1
        checkers = self.rng.sample(others, len(others))
        target = order.target
        first = await self._ask(checkers[0], step, attempt, order)
        if first is None:
            self._unchecked.pop(target, None)
            log.info("step %d: stage %d: %s's share, recomputed by %s, is its work", step + 1, stage, target[-8:],
                     "this head" if checkers[0] == self.leader else checkers[0][-8:])
            return
        if first.startswith(UNCHECKED):  # no verdict: the step waits for one (3 in a row: it withholds)
            self._unchecked[target] = self._unchecked.get(target, 0) + 1
            if self._unchecked[target] >= 3:
                self._convict(target, f"its share could not be checked 3 times in a row ({first[len(UNCHECKED):]})")
            raise AttemptFailed(f"the check of {target[-8:]}'s share could not run ({first[len(UNCHECKED):]})")
        self.mismatches += 1
        if checkers[0] == self.leader:  # the leading head recomputed it: its word is the run's
            self._convict(target, f"the leading head recomputed its share: {first}")
        if len(checkers) < 2:
            self._dispute(target, checkers[0], stage, first)
        second = await self._ask(checkers[1], step, attempt, order)
        if second is not None and second.startswith(UNCHECKED):
            raise AttemptFailed(f"the third check of {target[-8:]}'s share could not run")
        if second is not None:
            self._convict(target, f"two replicas recomputed its share and disagree with it: {first}")
        self._convict(checkers[0], f"it said {target[-8:]}'s share was false, and a third replica "
                                          f"recomputed the share and agrees with it")

    async def _ask(self, checker: str, step: int, attempt: int, order: CheckOrder) -> str | None:
        """None if `checker` finds the share to be the target's work, else why not: UNCHECKED + why
        when it found nothing either way (unreachable, no contribution held)."""
        reply = await self.send(checker, Command(self.run_hash, step, attempt, "check", check=encode_order(order)),
                                self.check_timeout)
        if reply.outcome != "failed":
            return None
        return reply.reason if order.target in reply.blame else UNCHECKED + reply.reason

    # ------------------------------------------------------------------ verdicts
    def _convict(self, peer: str, why: str) -> None:
        self._banned(peer, why)
        log.warning("replica %s is banned for the run: %s", peer[-8:], why)
        raise AttemptFailed(f"replica {peer[-8:]} was caught: {why}")

    def _dispute(self, a: str, b: str, stage: int, why: str) -> None:
        newer = max((a, b), key=lambda p: (self.first_seen.get(p, float("inf")), p))
        self._banned(newer, f"stage {stage}'s two replicas disagreed ({why}) and no third could settle it: the later "
                            f"to join is banned")
        log.warning("stage %d's two replicas %s and %s disagree (%s) and no third can settle it: the step is "
                    "not applied with their work, and %s, the later to join, is banned for the run", stage, a[-8:],
                    b[-8:], why, newer[-8:])
        raise AttemptFailed(f"stage {stage}'s two replicas disagree ({why})")

    def _banned(self, peer: str, why: str) -> None:
        if peer not in self.convicted:
            self.convicted = (self.convicted + [peer])[-64:]
            self.reasons = {p: self.reasons.get(p, why) for p in self.convicted}
            self.ban(peer)

"""`SpotChecks`: the leading head's side of verified contributions (issue 21; the replica's side
is peer/checks/share_check.py, the records protocol/spot_check.py).

After every stage's replicas have reduced, and before anything is applied:

1. **Blame.** A replica whose contribution another replica refused (NaN, a wrong size, tensors
   without microbatches), or that withheld it (never sent, or ended its reduce without sending it:
   peer/commit/reduce_watch.py), is named in that replica's reduce reply (`blame`);
   the reduce failed. With three replicas or more, the leader convicts a replica blamed by a majority
   of the other replicas of its stage that replied. With two, one's word against the other's proves
   nothing (a liar that joined first blamed every honest newcomer into a ban): the attempt is re-driven
   with nobody banned, and after `BLAME_RETRIES` such attempts of one step (or at once, if they blame
   each other) the stage is disputed as in item 3.
2. **Spot checks.** Each replica's share of the step (its microbatches' gradient sum) is
   recomputed, with probability `rate` (drawn here, after the contributions are in, so nobody
   knows ahead which share) or always if its stage's replicas name it a suspect (a share far
   from the rest, peer/checks/robust_sum.py), by another replica of its stage picked at random, from the inputs
   whose digests the SENDERS reported in their reduce replies. On a mismatch a third replica
   recomputes it: two of three computations convict the one they disagree with (the replica
   checked, or its checker). A check that finds nothing either way (the replica checked could not
   be reached) fails the attempt without a ban; a share drawn once is checked again at every retry
   of its step, each time by a checker that has not failed to check it yet where there is one, and the
   third such check in a row convicts (it withholds its inputs) if two checkers or more found nothing:
   one replica's word that another withholds is no proof (with two replicas, see item 3).
3. **Two replicas, no third.** A mismatch or a mutual blame between the only two replicas of a
   stage cannot say who lied, and join order says nothing either (a liar that joined first would get
   every honest newcomer banned). So nobody is banned: the attempt fails, the step is not applied with
   the doubtful work, and the stage is marked disputed (`disputed`, which the leader's abort names so
   that placement draws a third replica there, swarm/replicas/placement.py). The step is re-driven; its
   drawn share is checked again at every retry, and once a third replica of the stage has reduced, the
   one that made the claim is asked first and two of three settle it as in item 2 (a claim withdrawn on
   a retry bans nobody: the step then applies with work that passed its check).

A convicted replica is banned for the run here and, through the leader's next abort, everywhere;
the attempt is re-driven without it, so the liar's work is thrown out and redone and the run still
equals the one-process run. Checks cover exact replica sync (`powersgd`'s error feedback is each
replica's own and cannot be recomputed) and every stage.

4. **Heads.** Every head computes a share of stage 0 (peer/commit/head_work.py), so a head's share is
   drawn like any other's (the leader's own is not: it is the swarm's trusted driver) and the
   leader recomputes it itself (peer/checks/share_check.py `recompute_head_share`): the tokens it
   regenerates, the activations the head sent as the stage-1 replicas that took them report them,
   the gradients as their senders report them. The leader's verdict needs no third computation.
5. **Sender against receiver.** A boundary message is reported twice, by its sender ("a", "g") and by
   its receiver ("r", "q", with the sender's signature of it, protocol/boundary_sig.py). Where the two
   differ, the signature settles it (peer/checks/boundary_evidence.py): a valid one convicts the sender,
   which signed other bytes than it reports; none convicts the receiver, which reports what was never
   sent. A receiver's report that a head's check relies on is likewise used only when it is signed.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from peer.checks.boundary_evidence import BoundaryEvidence, Verify
from peer.daemon.step_log import AttemptFailed
from protocol.control import Command, CommandReply
from protocol.spot_check import DIGEST_BYTES, CheckOrder, Sent, encode_order

log = logging.getLogger(__name__)

Send = Callable[..., Awaitable[CommandReply]]  # (peer, command[, timeout])
UNCHECKED = "unchecked: "  # a check that found nothing either way
BLAME_RETRIES = 2  # attempts of a step re-driven on a one-sided blame between two replicas before it is disputed


class SpotChecks:
    def __init__(self, run_hash: str, n_stages: int, rate: float, send: Send, ban: Callable[[str, str], None],
                 exact: bool = True, rng: random.Random | None = None, leader: str = "",
                 check_timeout: float | None = None, verify: Verify | None = None) -> None:
        self.run_hash, self.n_stages, self.rate, self.exact = run_hash, n_stages, rate, exact
        self.check_timeout = check_timeout  # how long a check may take (None: the sender's default)
        self.leader = leader  # this leading head: its word is the run's, it checks the other heads' shares
        self.send, self.ban = send, ban
        self.rng = rng or random.SystemRandom()  # drawn where no replica can predict it
        self.verify = verify  # a sender's signature of a boundary message (peer/daemon/interfaces.py `Signer`)
        # stage -> (step, replica checked, the replica that said its share was false): waits for a third replica
        self.disputed: dict[int, tuple[int, str, str]] = {}
        self.evidence: BoundaryEvidence | None = None  # the attempt's boundary reports, and what they prove
        self._drawn: tuple[int, set[str]] = (-1, set())  # (step, shares drawn): a retry of the step checks them again
        self._no_verdict: tuple[int, set[str]] = (-1, set())  # (step, checkers that found nothing either way)
        self._unchecked: dict[str, list[str]] = {}  # replica -> the checkers of its checks in a row that could not run
        self.convicted: list[str] = []  # banned for the run, newest last: every abort names them
        self.reasons: dict[str, str] = {}  # why each was banned: the leader tells the banned replica (step/driver.py)
        self.checks = self.mismatches = 0
        self._blames: tuple[int, int] = (-1, 0)  # (step, attempts of it that ended in a one-sided blame of two)
        self.checkable = 0  # shares that could be drawn: work done, and another replica of the stage to check it

    def disputed_stages(self, step: int) -> list[int]:
        """The stages whose two replicas disagree at `step` (the step waits for a third replica there)."""
        return sorted(s for s, (at, _, _) in self.disputed.items() if at == step)

    # ------------------------------------------------------------------ 1. blame in reduce replies
    def judge_blame(self, replies: dict[str, CommandReply], members: dict[str, int], step: int = -1) -> None:
        """Convict (and raise AttemptFailed) on the blame in a failed reduce's replies."""
        for stage in range(self.n_stages):
            peers = [p for p in replies if members.get(p) == stage]
            blamed = {p: [q for q in peers if p in replies[q].blame and q != p] for p in peers}
            for p, by in blamed.items():
                others = len(peers) - 1
                if not by:
                    continue
                if others >= 2:
                    if 2 * len(by) > others:
                        self._convict(p, f"blamed by {len(by)} of the {others} other replicas of stage {stage}: "
                                         f"{replies[by[0]].reason}")
                    continue
                self._one_blame(step, stage, p, by[0], replies)

    def _one_blame(self, step: int, stage: int, blamed: str, by: str, replies: dict[str, CommandReply]) -> None:
        """The only two replicas of `stage`: `by` says `blamed`'s contribution did not come, came too slowly or was
        refused. One's word against the other's cannot tell a withheld or slow contribution from a false claim (or
        a path between them that failed), and join order must not (item 1: a liar that joined first got every
        honest newcomer banned so). The attempt is re-driven, nobody banned; at the `BLAME_RETRIES`+1-th attempt
        of the step that still ends so, or at once if they blame each other, the stage is disputed: the step waits
        for a third replica (placement draws one), and then two of three decide."""
        if blamed in replies[by].blame and by in replies[blamed].blame:
            self._dispute(step, stage, blamed, by, "they blame each other")
        n = self._blames[1] + 1 if self._blames[0] == step else 1
        self._blames = (step, n)
        why = replies[by].reason
        if n > BLAME_RETRIES:
            self._dispute(step, stage, blamed, by, f"{by[-8:]} says, attempt after attempt, that {blamed[-8:]}'s "
                                                   f"contribution did not reach it: {why}")
        log.warning("stage %d: replica %s says %s's contribution did not reach it (%s); with two replicas that proves "
                    "nothing: nobody is banned, and the step is re-driven", stage, by[-8:], blamed[-8:], why)
        raise AttemptFailed(f"stage {stage}'s replica {by[-8:]} blames {blamed[-8:]} ({why}); re-driven")

    # ------------------------------------------------------------------ 2. recomputation
    async def run(self, step: int, attempt: int, members: dict[str, int], replies: dict[str, CommandReply],
                  shares: dict[int, dict[str, list[int]]], own_sent: list[Sent]) -> None:
        """Draw and run this attempt's checks; raise AttemptFailed if a replica is convicted or a
        dispute leaves doubtful work (`shares`: stage -> replica -> its microbatches, as agreed)."""
        if not self.exact or self.rate <= 0:
            return
        sent = [(p, s) for p, r in replies.items() for s in r.sent] + [("", s) for s in own_sent]
        self.evidence = BoundaryEvidence(self.run_hash, step, attempt, self.leader, sent, self.verify) \
            if self.verify is not None else None
        if self.evidence is not None and (liar := self.evidence.liar()) is not None:  # item 5
            self._convict(*liar)
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

        def signed_receipts(mb: int) -> None:
            """A head's check relies on what stage 1 reports it got: only a report its sender signed counts."""
            for p, s in sent:
                if s.kind == "r" and s.microbatch == mb and s.to == target and self.evidence is not None:
                    if (liar := self.evidence.received(p or self.leader, s)) is not None:
                        self._convict(*liar)
        if self.n_stages == 1:  # a one-stage swarm's head: its only input is the tokens, which the checker regenerates
            return CheckOrder(target, list(mbs), [(bytes(DIGEST_BYTES), None)] * len(mbs))
        inputs = []
        for mb in mbs:
            if stage == 0:  # a head's input is the tokens (regenerated); what it sent on, as its receiver saw it
                signed_receipts(mb)
                a, g = digest_of("r", mb, 1), digest_of("g", mb, 1)
                ends = {(target, q) for q, s in sent if s.kind == "r" and s.microbatch == mb and s.to == target}
            else:
                a = digest_of("a", mb, stage - 1)
                g = digest_of("g", mb, stage + 1) if stage < self.n_stages - 1 else None
                ends = {(p or self.leader, target) for p, s in sent if s.kind == "a" and s.microbatch == mb
                        and s.to == target}
            for sender, receiver in sorted(ends):  # item 5 without signatures: nothing says which end lies
                out, seen = said(sender, "a", mb, receiver), said(receiver, "r", mb, sender)
                if self.evidence is None and out and seen and not out & seen and sender != self.leader:
                    self._dispute(-1, stage, sender, receiver, f"they report different bytes for microbatch {mb}")
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
        failed = self._unchecked.get(target, [])
        if self._no_verdict[0] != step:
            self._no_verdict = (step, set())
        # a checker that has not failed to check a share of this step yet asks first
        checkers.sort(key=lambda c: c in failed or c in self._no_verdict[1])
        at, checked, accuser = self.disputed.get(stage, (-1, "", ""))
        if (at, checked) == (step, target) and accuser in checkers and len(checkers) > 1 and accuser not in failed:
            # a third replica is here: the one that said the share was false says it again first (item 3)
            checkers.remove(accuser)
            checkers.insert(0, accuser)
        first = await self._ask(checkers[0], step, attempt, order)
        if first is None:
            self._unchecked.pop(target, None)
            log.info("step %d: stage %d: %s's share, recomputed by %s, is its work", step + 1, stage, target[-8:],
                     "this head" if checkers[0] == self.leader else checkers[0][-8:])
            return
        if first.startswith(UNCHECKED):  # no verdict: the step waits for one (3 in a row, by 2 checkers: it withholds)
            why = first[len(UNCHECKED):]
            failed = self._unchecked[target] = failed + [checkers[0]]
            self._no_verdict[1].add(checkers[0])
            if len(failed) >= 3 and len(set(failed)) >= 2:
                self._convict(target, f"its share could not be checked 3 times in a row ({why})")
            if len(failed) >= 3 and len(checkers) < 2:  # one checker's word that it withholds is no proof
                self._dispute(step, stage, target, checkers[0], f"its share could not be checked: {why}")
            raise AttemptFailed(f"the check of {target[-8:]}'s share could not run ({why})")
        self.mismatches += 1
        if checkers[0] == self.leader:  # the leading head recomputed it: its word is the run's
            self._convict(target, f"the leading head recomputed its share: {first}")
        if len(checkers) < 2:
            self._dispute(step, stage, target, checkers[0], first)
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

    def pardon(self, peer: str) -> None:
        """The swarm key lifted `peer`'s ban (`swarm unban`): later aborts no longer name it, and its checks
        start afresh."""
        if peer in self.convicted:
            log.info("replica %s's ban is lifted by the swarm's operator: it may take part again", peer[-8:])
        self.convicted = [p for p in self.convicted if p != peer]
        self.reasons.pop(peer, None)
        self._unchecked.pop(peer, None)

    def _dispute(self, step: int, stage: int, a: str, b: str, why: str) -> None:
        """Item 3: `a` and `b`, the only two replicas of `stage`, disagree (at `step`, `b` said `a`'s share was
        false; -1: another kind of disagreement). Nobody is banned; the step waits for a third replica."""
        if step >= 0:
            self.disputed[stage] = (step, a, b)
        log.warning("stage %d's two replicas %s and %s disagree (%s) and no third can settle it: the step is not "
                    "applied with their work, nobody is banned, and the step waits for a third replica of stage %d",
                    stage, a[-8:], b[-8:], why, stage)
        raise AttemptFailed(f"stage {stage}'s two replicas disagree ({why}); waiting for a third replica")

    def _banned(self, peer: str, why: str) -> None:
        if peer not in self.convicted:
            self.convicted = (self.convicted + [peer])[-64:]
            self.reasons = {p: self.reasons.get(p, why) for p in self.convicted}
            self.ban(peer, why)

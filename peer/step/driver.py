"""`StepDriver`: the leading head's loop: one synchronous step of the whole swarm at a time.

Every head (stage-0 replica) runs one. One head leads (`peer/step/leadership.py`: the first live head
of the swarm key's lease; without a coordinator, the head that announces it leads stays the
leader); the others stand by (announcing a measured compute speed, `peer/step/calibration.py`),
ping it (`peer/step/succession.py`), and the next in line takes over at once when it stops answering (every other peer
checks for itself that the old leader is gone before it follows the new one).
A step, as the leader drives it (docs/design.md section 3):

1. wait until every stage has a live peer (the swarm pauses, it does not exit, and says
   which stage is missing);
2. split the step's microbatches over the live heads by speed (`peer/commit/head_work.py`): each forwards
   its share and sends it on; the router picks a replica of the next stage for each, weighted by
   measured round trips and requests in flight, and so does every stage downstream;
3. wait for every microbatch's gradient, with a deadline that follows the measured step time
   (`peer/step/microbatch_phase.py`);
4. commit (`peer/commit/commit.py`): the live replicas of every stage that `ReduceSeats` seats (every one,
   unless a stage has more than those that work and `--probation-seats`: `peer/step/seats.py`) reduce, and if each stage
   agrees on one sum that holds every microbatch once (`peer/step/reduce_verdict.py`), every replica
   that reduced applies it.

Anything that goes wrong in 2-4 (a replica died, a message was lost, replicas disagree)
aborts the attempt everywhere and re-drives the step as a new attempt: a failure costs a
retry, never a step, and no microbatch is lost or counted twice. fp16: an overflow skips the step everywhere.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import torch

from peer.checks.spot_checks import SpotChecks
from peer.checks.state_votes import StateVotes
from peer.commit.commit import StepCommit
from peer.commit.head_work import HeadWork
from peer.daemon.daemon import StageDaemon
from peer.daemon.interfaces import PeerDirectory
from peer.daemon.step_log import AttemptFailed, StepLog, timed
from peer.daemon.transfer_time import StepDeadlines
from peer.runner.stage import StageError
from protocol.control import MAX_GROUP, Command, CommandReply
from protocol.step_record import StepRecord

from .attempt_watch import AttemptWatch
from .calibration import PERIOD_S, Calibration
from .commands import UNREACHABLE, CommandSender
from .microbatch_phase import MicrobatchPhase
from .redrive_cause import Failure, RedriveCause, describe
from .reduce_verdict import judge_reduce, refusal_evidence
from .seats import PROBATION_SEATS, STATUS_TIMEOUT_S, ReduceSeats
from .succession import Succession

log = logging.getLogger(__name__)


class StepDriver:
    def __init__(self, daemon: StageDaemon, commit: StepCommit, directory: PeerDirectory,
                 batches: Callable[[int, int], torch.Tensor], *, min_timeout: float = 15.0,
                 first_timeout: float = 120.0, command_timeout: float = 90.0, ping_period: float = 1.0,
                 ping_failures: int = 3, watch_period: float | None = 1.0, spot_check_rate: float = 1 / 16,
                 calibrate_period: float | None = PERIOD_S, max_group: int = MAX_GROUP,
                 probation_seats: int = PROBATION_SEATS,
                 sign_record: Callable[[StepRecord], StepRecord] | None = None) -> None:
        if not daemon.runner.is_first:
            raise ValueError("only a head peer drives steps.")
        self.daemon, self.commit, self.directory, self.batches = daemon, commit, directory, batches
        self.runner, self.spec, self.peer_id = daemon.runner, daemon.spec, daemon.peer_id
        # the first step, a head's share, a spot check and a reduce wait for their bytes on a home uplink too
        self.deadlines = StepDeadlines(self.spec, first_timeout, command_timeout)
        self.command_timeout = command_timeout
        self._commands = CommandSender(daemon, commit, command_timeout)
        self._broadcast, self._command, self._send = (self._commands.broadcast, self._commands.command,
                                                      self._commands.send)
        # every replica's share of a step is recomputed by another with this probability (peer/checks/spot_checks.py)
        signer = getattr(daemon.link, "signer", None)  # boundary messages' signatures settle who lies about them
        self.spot = SpotChecks(self.spec.run_hash, self.spec.n_stages, spot_check_rate, self._send, directory.ban,
                               exact=self.spec.replica_sync == "exact", leader=self.peer_id,
                               check_timeout=self.deadlines.share, verify=signer.verify if signer else None)
        self._record = b""  # the signed StepRecord of the attempt's data (`MicrobatchPhase.run`)
        self.seats = ReduceSeats(self.peer_id, max_group, probation_seats)  # who reduces: work first (seats.py)
        self.redrives = RedriveCause()  # why one step keeps failing, named after a few attempts
        # sends the coordinator a named refuser's signed refusal of this head's reduce (None: nobody to judge it)
        self.report_refusal: Callable[[bytes], Awaitable[object]] | None = None
        # last_snapshots: (step, stage -> sha256) of the newest step at which every stage's replicas agreed;
        # on_committed(steps done, last_workers, last_snapshots) after each step: what the leader vouches for
        self.last_workers, self.last_snapshots = {}, None
        self._workers_of = -1  # the steps done after the commit that last_workers did the work of
        self.commit_parts: dict[str, float] = {}  # seconds of the last commit by part (StepLog.commit_parts)
        self.on_committed: Callable[[int, dict, tuple | None], None] | None = None
        self.votes = StateVotes(self.peer_id, directory)  # the state hashes in apply replies (checks/state_votes.py)
        self._commands.on_apply = self.votes.add
        self._leading, self._named = False, []  # _named: who reduced the last step this head committed
        self._applying: asyncio.Task | None = None  # telling the other peers to apply the last step
        self.paused: list[int] = []  # stages without a live peer while paused, else []
        # called when a pause ends and after a failed attempt: True if the swarm rolled back to a
        # snapshot meanwhile (peer/state/rollback.py), and the driver goes on from the head's new step
        self.realign: Callable[[], Awaitable[bool]] | None = None
        # a standby head announces its measured compute speed, not 0 (peer/step/calibration.py); None: it announces 0
        self.calibration = Calibration(daemon, batches, period=calibrate_period) if calibrate_period else None
        self.heads = Succession(daemon, directory, self._command, self.calibration, ping_period, ping_failures)
        # every head computes a share of each step (peer/commit/head_work.py): the leader splits it, the others serve
        self.work = HeadWork(daemon, directory, batches, self._send, self.deadlines.share,
                             lambda: self.calibration.speed if self.calibration is not None else None)
        commit.compute_share, commit.share_check.tokens = self.work.compute, batches  # a head's share, its check
        # pings the swarm while microbatches are out: a peer that died holding one is seen in seconds
        watch = AttemptWatch(daemon.link, directory, self.spec.run_hash, watch_period,
                             timeout=self.deadlines.ping) if watch_period else None
        # sign_record signs the StepRecord that every reduce command carries, so that the standby heads check the
        # data this head fed (None: a swarm without a coordinator, nobody to prove anything to)
        self.microbatches = MicrobatchPhase(daemon, commit, self.work, batches, self._members, watch,
                                            min_timeout=min_timeout, first_timeout=self.deadlines.first_step,
                                            sign_record=sign_record)

    # ------------------------------------------------------------------ leading and standing by
    async def drive(self, until: int | None, on_step: Callable[[StepLog], None]) -> None:
        """Drive steps while this head leads, stand by otherwise, until the swarm reaches `until`."""
        try:
            await self._drive(until, on_step)
        finally:
            if self._applying is not None:  # the last step is applied everywhere before this head leaves
                await asyncio.gather(self._applying, return_exceptions=True)

    async def _drive(self, until: int | None, on_step: Callable[[StepLog], None]) -> None:
        while until is None or self.runner.step < until:
            if self.daemon.state == "syncing" and not self.heads.is_set_aside(self.peer_id):
                self.daemon.state = "online"  # set aside for being behind: a candidate again
                await self.directory.announce(self.daemon.status())
            leader = await self.heads.leader(self._leading)
            if leader != self.peer_id:
                if self._leading:
                    log.info("head %s leads; this head stands by", leader[-8:])
                    self._leading = False
                    await self._claim(False)
                    if self.calibration is not None:
                        self.calibration.reset()  # it announced the steps' speed: measure its own at once
                await self.heads.stand_by(leader)
                continue
            if not self._leading:
                self._leading = True
                await self._claim(True)  # at once: heads that join from now on stand by for this one
                try:
                    took_over = await self._take_over()
                except StageError as e:  # its stage moved under it (a forwarded step, an abort): look again
                    log.warning("taking over the lead failed (%s); looking again", e)
                    took_over = False
                    await asyncio.sleep(0.2)  # what moved it may need a moment to settle
                if not took_over:
                    self._leading = False
                    await self._claim(False)
                    continue
            record = await self.train_step()
            if record is not None:
                on_step(record)

    async def _claim(self, leads: bool) -> None:
        if not leads:
            self.seats.forget()
        self.daemon.leads = leads
        await self.directory.announce(self.daemon.status())

    async def _take_over(self) -> bool:
        """Becoming the leader: finish a step the old leader left half-applied, or start a fresh
        attempt above every attempt seen. False if this head is behind and must not lead (unless
        its stage was restored from a snapshot: then the swarm rolls back to it first)."""
        await self._realigned()
        step = self.runner.step
        members = await self._members()
        replies = await self._broadcast(members, "status", step, 0)
        self.work.proven = {p for p, r in replies.items() if members[p] == 0 and r.outcome == "ok"}  # may get shares
        # a step the old leader applied here but not yet everywhere: finish it on the peers it missed
        short = [p for p, r in replies.items() if r.outcome == "behind"]  # one step short of ours
        last = self.commit.last_applied
        if short and last is not None and last[0] == step - 1:
            log.info("finishing step %d on %d peer(s) the previous leader did not reach", step, len(short))
            await self._broadcast({p: 0 for p in short}, "apply", *last, last[0] in self.runner.skipped_steps)
        ahead = [p for p, r in replies.items() if r.outcome == "ahead"]  # they are past our step
        reduced = self.runner.reduced
        if ahead:
            if reduced is None or reduced.step != step:
                log.warning("this head is behind the swarm (peers at a later step); it will not lead")
                self._leading = False
                # the swarm went on, so a head leads it: most likely the one this head found silent (a missed ping
                # on a loaded machine). Still avoided, its commands would be refused here until the ban ends, and
                # this head, downloaded level, would fall behind again (seen: behind for good, then no head could
                # lead once the leader died)
                for peer in self.heads.take_back():
                    self.directory.forgive_failure(peer)
                self.heads.set_aside(self.peer_id, 30.0)
                # announced "syncing", it is no live head to anyone: the next head in the lease's order
                # leads meanwhile instead of every peer waiting on this one
                self.daemon.state = "syncing"
                await self.directory.announce(self.daemon.status())
                return False
            log.info("finishing step %d, which the previous leader applied only in part", step + 1)
            holders = [p for p, r in replies.items() if r.outcome == "ok" and r.contributors
                       and r.attempt == reduced.attempt]
            skip = any(replies[p].overflow for p in ahead)  # the peers that applied it say whether they skipped it
            await self._broadcast({p: 0 for p in holders} | {self.peer_id: 0}, "apply", step, reduced.attempt, skip)
            return True
        top = max([r.attempt for r in replies.values() if r.outcome == "ok"] + [self.daemon.attempt])
        await self._broadcast(members, "abort", step, top)
        return True

    # ------------------------------------------------------------------ one step
    async def train_step(self) -> StepLog | None:
        """Drive the step in progress to completion, re-driving failed attempts; returns its log, or
        None if the step was applied here by other means meanwhile (a head that joined by download
        and leads at once may still get the step its donor was committing, forwarded)."""
        step, t0 = self.runner.step, time.perf_counter()
        await self.daemon.gate.wait_for_switch(step)
        attempts = 0
        while True:
            if self.runner.step != step:
                return None
            if await self._wait_for_coverage() and await self._realigned():
                return None
            attempt = self.daemon.attempt  # after an abort every peer (this one too) is on the next attempt
            attempts += 1
            try:
                losses, tokens, self._record = await self.microbatches.run(step, attempt)
                t_commit = time.perf_counter()
                await self._commit(step, attempt)
                commit_seconds = time.perf_counter() - t_commit
                break
            except StageError:
                if self.runner.step == step:
                    raise
                # two heads led at once for a moment (each claimed before it saw the other's claim)
                # and the other one's step was applied here: not ours to drive
                log.info("step %d was applied here under another head; following it", step + 1)
                return None
            except AttemptFailed as e:
                if await self.heads.leader(self._leading) != self.peer_id:
                    log.info("step %d, attempt %d failed (%s); another head leads now", step + 1, attempt, e)
                    return None
                log.warning("step %d, attempt %d failed (%s); re-driving it", step + 1, attempt, e)
                await self._name_the_cause(step, attempt, e)
                await self._commands.abort(await self._members(), step, attempt, self.spot)  # bans the convicted
                if await self._realigned():
                    return None
                await asyncio.sleep(min(attempts, 10) * 0.2)  # back off: what failed may need a moment to settle
        record = next((r for r in reversed(self.commit.records) if r.step == step), None)
        if record is None:  # the commit found the step applied here already (not by this head's commit)
            return None
        if self.on_committed is not None:
            self.on_committed(step + 1, self.last_workers, self.last_snapshots)
        seconds = time.perf_counter() - t0
        self.daemon.tokens_done += tokens
        self.daemon.throughput = tokens / max(seconds, 1e-9)
        self.daemon.last_loss = sum(losses) / len(losses)
        return StepLog(step + 1, self.daemon.last_loss, tokens, seconds, self.runner.version_for_step(step),
                       record.lr, attempts, commit_seconds, self.commit.last_sync_bytes, record.skipped,
                       self.runner.scale, {h: len(m) for h, m in self.work.shares.items()}, dict(self.commit_parts))

    async def _name_the_cause(self, step: int, attempt: int, e: AttemptFailed) -> None:
        """After a few failed attempts of one step: one line that says why, and the peer named, routed around."""
        found = self.redrives.note(step, Failure(attempt, str(e), e.peer, e.evidence))
        if found is None:
            return
        members = await self._members()
        stage = members.get(found.culprit) if found.culprit else None
        others = sum(1 for p, s in members.items() if s == stage and p != found.culprit)
        log.warning("%s", describe(found, stage, others))
        if found.culprit is not None and found.culprit != self.peer_id:
            self.directory.report_failure(found.culprit)
            if found.evidence and self.report_refusal is not None:  # its signed refusal: the coordinator judges it
                self.daemon.spawn(self.report_refusal(found.evidence))

    async def _realigned(self) -> bool:
        return self.realign is not None and await self.realign()

    async def _wait_for_coverage(self) -> bool:
        """Wait until every stage has a live peer; True if the swarm was paused meanwhile."""
        while True:
            missing = [s for s in range(1, self.spec.n_stages) if not await self.directory.members(s)]
            if not missing:
                resumed = bool(self.paused)
                if self.paused:
                    log.info("every stage has a live peer again; training resumes")
                    self.daemon.state = "online"
                    await self.directory.announce(self.daemon.status())
                self.paused = []
                return resumed
            if missing != self.paused:
                log.warning("paused: stage%s %s ha%s no live peer; waiting for one to join",
                            "s" if len(missing) > 1 else "", ", ".join(map(str, missing)),
                            "ve" if len(missing) > 1 else "s")
                self.daemon.state = "paused"
                # at once: a peer that comes to fill the stage reads the step to start at from this
                await self.directory.announce(self.daemon.status())
            self.paused = missing
            await asyncio.sleep(0.5)  # poll interval of the directory while the swarm is paused

    async def _members(self) -> dict[str, int]:
        """Every live peer of every stage -> its stage (this head included)."""
        found = await asyncio.gather(*(self.directory.members(s) for s in range(self.spec.n_stages)))
        out = {p.peer_id: s for s, peers in enumerate(found) for p in peers}
        out[self.peer_id] = 0
        return out

    async def _commit(self, step: int, attempt: int) -> None:
        members = await self._members()
        seating = await self.seats.seat(members, step, attempt, self._status, await self.directory.lease_order() or [],
                                        self._record)
        groups = seating.groups
        cmds = {peer: Command(self.spec.run_hash, step, attempt, "reduce", groups[stage], self._record)
                for stage, peers in groups.items() for peer in peers}
        self.commit_parts = {}
        with timed(self.commit_parts, "reduce"):
            replies = dict(zip(cmds, await asyncio.gather(
                *(self._send(p, c, self.deadlines.reduce(step, members[p], len(groups[members[p]])))
                  for p, c in cmds.items()))))
        self.commit_parts.update(self.commit.clock.parts("own_"))
        # the replicas' states after the last step: a replica hashes it while this step's microbatches run and
        # answers this reduce only once its hash is done, so its apply reply (which carries it) is in by now.
        # Only the hashes of that step's workers count: an id that did no work has no say on the state (else ids
        # that reduce empty contributions would outvote the replicas that worked; none counts after a take-over)
        workers = self.last_workers if self._workers_of == step else {}
        self.votes.conclude(step, {p: s for s, peers in workers.items() for p in peers})
        if any(r.blame for r in replies.values()):  # a replica refused another's contribution, or it never came
            self.spot.judge_blame(replies, members, step)
        unreached = [p for p, r in replies.items() if r.reason.startswith(UNREACHABLE) and p not in self.commit.workers]
        for p in unreached + seating.unreachable:
            self.directory.report_failure(p)  # an id that never did work and nobody reaches: not asked every step
        try:
            verdict = judge_reduce(replies, members, self.spec.n_stages, self.work.shares)
        except AttemptFailed as e:  # a head that refused this reduce under its signature: evidence to keep
            e.evidence = refusal_evidence(self.spec.run_hash, self._record, e.peer, replies)
            raise
        # nothing is applied before the drawn shares are shown to be their replicas' work (a step that
        # overflowed in fp16 applies nothing: its shares carry no numbers to check)
        if not verdict.overflowed:
            with timed(self.commit_parts, "checks"):
                await self.spot.run(step, attempt, members, replies, verdict.shares,
                                    self.daemon.boundary.sent(step, attempt))
        if skip := bool(verdict.overflowed):  # fp16 (protocol/loss_scale.py): one stage's overflow skips it everywhere
            log.warning("step %d: fp16 gradients overflowed on stages %s: skipped everywhere, loss scale %g -> %g",
                        step + 1, verdict.overflowed, self.runner.scale, self.runner.scale / 2)
        self._named = self._commands.named = sorted(verdict.named)[:MAX_GROUP]  # every apply names them (placement)
        self.last_workers = verdict.workers  # who did the step's work, by stage (issue 20: re-fits count only them)
        self.seats.remember(step + 1, verdict.workers)
        self._workers_of = step + 1
        self.work.proven = {p for p in verdict.named if members[p] == 0}  # heads that reduced: shares from now on
        if verdict.snapshots is not None:  # every stage's snapshot at one step
            self.last_snapshots = verdict.snapshots
        # every stage reduced: the step must now be applied everywhere. This head applies at once and goes on; the
        # others are told meanwhile (their next share waits for it), and a stage whose replicas all failed to apply
        # (views of the leader settling, a lost reply) is asked again: it holds the sum; a second apply is "ok"
        if self.peer_id in verdict.appliers:
            with timed(self.commit_parts, "apply"):
                mine = await self._send(self.peer_id, Command(self.spec.run_hash, step, attempt, "apply", self._named,
                                                              skip=skip))
            if mine.outcome != "ok":
                raise AttemptFailed(f"this head could not apply the step: {mine.reason}")
        others = {p: members[p] for p in verdict.appliers if p != self.peer_id}
        self._applying = asyncio.create_task(self._commands.apply_everywhere(others, step, attempt, skip))
        if seating.left_out:  # told the apply, they find they hold no sum of the step: left behind, they catch up
            self.daemon.spawn(self._broadcast(seating.left_out, "apply", step, attempt, skip))

    async def _status(self, peer: str, step: int, attempt: int) -> CommandReply:
        return await self._command(peer, "status", step, attempt, timeout=STATUS_TIMEOUT_S)

"""`StepCommit`: one peer's side of ending a step together with its stage's other replicas.

The step driver sends every peer of every stage a command (protocol/control.py):

    status  report this peer's step, attempt and the microbatches it has done;
    reduce  exchange gradient sums with the named candidate replicas of this stage and keep
            their total; the reply names whose contributions were summed;
    apply   take the optimizer step with that total; the command names the peers of every
            stage whose reduce agreed on it (the step's workers: placement counts them);
    abort   drop the partial work of a failed attempt;
    rollback  go back to the stage's snapshot at the step (`peer/state/rollback.py`).

The all-reduce: every replica sends its contribution (its microbatches and the flat sum of
their gradients) to every other candidate; a candidate that is not at this step says so and
is left out (one step short of it, a reduce command, contribution or probe first waits, bounded, for the
apply of the step before, which the leader sends while the next step starts: `StageDaemon.until_step`);
then each adds the contributions up in ascending peer-id order. Addition in one order gives every replica
the same bits, so replicas stay identical, and since the summed gradient is the same whatever replica
computed each microbatch, a swarm of replicas trains like one process (to float rounding of the changed
summation order). A replica holding microbatches whose contribution did not arrive makes the reduce fail;
the driver then aborts the attempt everywhere and re-drives the step: no microbatch is lost or counted twice.

Gradients travel in the stage's `SyncLayout` (constrained weights in subspace coordinates).
With replica_sync "powersgd" (after its `replica_sync_warmup` exact steps) the reduce has two
rounds (docs/algorithms.md 5.2): each replica
sends its exact part and its P factors, every replica adds them up in the same order and
orthonormalizes the summed P, then each sends its Q factors and adds those up; every replica
rebuilds the same approximation of the summed gradient from the same sums, so replicas stay
identical. Its error feedback and warm-started Q (`peer/runner/replica_sync.py`) change only when the
step is applied. The messages of a reduce, and the bytes a replica sends in them (`sync_bytes`),
are `peer/commit/reduce_exchange.py`'s.

While it waits for contributions a replica probes the ones still missing (`peer/commit/reduce_watch.py`): one
that died, or will never send (its reduce ended, it got no reduce command), fails the reduce within seconds; one
alive and sending is waited for up to `reduce_timeout` plus its bytes' time on the spec's `slowest_uplink_bps`.

Replicas catching up after a state download (`peer/state/state_transfer.py`) get each reduced sum
forwarded by their donor ("follow") until they take part in a reduce themselves: under powersgd the
sums of the reduce (exact part, P, Q'), from which the follower rebuilds the same gradient: about two
contributions' bytes a step (0.8-1.0 MB at `small`), not the stage's whole gradient (26-38 MB a step at
`small`, 1.1-1.6 GB at `large`). A lone replica with a follower therefore reduces powersgd's way with
itself (round 1 and 2 over its own factors, its error fed back) instead of exactly.
fp16 (protocol/loss_scale.py): an overflowed share is a flagged contribution with no numbers; the reduce's
reply says if the stage overflowed, the apply if the swarm skips the step (`Command.skip`).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from peer.checks.robust_sum import suspects
from peer.checks.share_check import ShareCheck
from peer.daemon.daemon import StageDaemon
from peer.daemon.step_log import PartClock
from peer.daemon.transfer_time import TransferWait
from peer.runner.reduced import Reduced, sum_contributions, sum_factors
from peer.runner.replica_sync import PowerSync, flat_limits
from peer.runner.stage import StageError
from peer.runner.state_hasher import StateHasher
from protocol.control import (
    BadContribution,
    Command,
    CommandReply,
    Contribution,
    FlatLimits,
    ReduceProbe,
    decode_command,
    decode_reduce,
    encode_probe_reply,
    encode_reply,
)
from protocol.refusal import statement
from protocol.spot_check import InputsRequest
from protocol.wire import KIND_CONTROL, KIND_DRIVE, KIND_REDUCE, WireError

from .follow_forward import FollowForwarder
from .head_work import serve_work
from .reduce_exchange import ReduceExchange
from .reduce_watch import RunningReduces

log = logging.getLogger(__name__)

APPLIED_MEANWHILE = "applied already."  # an apply that found its step taken by other means (a forwarded step)


class StepCommit:
    def __init__(self, daemon: StageDaemon, *, reduce_timeout: float = 60.0, probe_period: float = 1.0,
                 dead_after: float = 5.0, mute_after: float = 15.0, straggle_after: float = 30.0) -> None:
        self.daemon, self.runner = daemon, daemon.runner
        self.spec, self.stage, self.peer_id = daemon.spec, daemon.stage, daemon.peer_id
        # a deadline that grows with the bytes, at the slowest uplink the swarm waits for (a rule of its spec)
        self.wait = TransferWait(reduce_timeout, self.spec.slowest_uplink_bps)
        # the reduce's messages; how missing contributors are probed (peer/commit/reduce_watch.py)
        self.exchange = ReduceExchange(daemon, self.wait, dict(period=probe_period, dead_after=dead_after,
                                                                    mute_after=mute_after,
                                                                    straggle_after=straggle_after))
        self.share_check = ShareCheck(daemon, self.wait)  # spot checks of other replicas' shares
        self._summed: tuple[tuple[int, int], dict[str, Contribution]] | None = None  # the last reduce's inputs
        self._suspects: dict[tuple[int, int], list[str]] = {}  # shares far from the rest (peer/checks/robust_sum.py)
        self._running = RunningReduces()
        self._limits = flat_limits(self.spec, self.runner)
        self.forwarder = FollowForwarder(daemon, self._limits, self.wait)  # to replicas catching up
        self.power = PowerSync(self.runner) if self.spec.replica_sync == "powersgd" else None
        # who the leader's last `apply` named as having reduced (every stage): placement's workers, not claims
        self.workers: list[str] = []
        self.records: list = []  # StepRecords of the steps applied here
        self.last_applied: tuple[int, int] | None = None  # (step, attempt) of the last sum applied here
        self.on_applied: Callable[[int], None] | None = None  # called with the new step number
        self.on_rollback: Callable[[Command], Awaitable[CommandReply]] | None = None  # peer/state/rollback.py
        # a head's check of the leader's step record before it sums with it: why not, or None
        self.check_record: Callable[[Command], Awaitable[str | None]] | None = None
        self.on_lease: Callable[[], Awaitable[object]] | None = None  # the coordinator says: read the lease now
        self.compute_share: Callable[[Command], Awaitable[list[float] | str]] | None = None  # a head's (head_work.py)
        self.own_snapshot: Callable[[], tuple[int, str] | None] | None = None  # (step, sha256) of its newest
        self.synced_steps = 0  # steps applied here whose reduce had another replica in it
        self.last_sync_bytes = 0  # what the last applied step's reduce sent
        self.hasher = StateHasher(self.stage)  # the state hash after every few steps (peer/runner/state_hasher.py)
        # the leader's command of a later step (or an apply of this one, unsummed here) came: the swarm went on without
        # this replica, whose owner catches up (swarm/replicas/own_state.py). Only the leader's commands count
        self.on_behind: Callable[[int], None] | None = None
        self.banned = asyncio.Event()  # the leader's abort named this peer: banned for the run
        self.ban_reason = ""  # why, as the leader said (peer/checks/spot_checks.py)
        self.disputed: tuple[int, list[int]] = (-1, [])  # (step, stages waiting for a third replica): the last abort's
        self.clock = PartClock()  # the parts of the last reduce here (the driver's step log)

    def limits(self) -> FlatLimits:
        return self._limits

    def sum_on_its_way(self) -> bool:
        """Whether the step in progress here may still be applied without a download: a reduce of it runs here,
        or its sum is held here (the leader's apply may be on its way)."""
        reduced, step = self.runner.reduced, self.runner.step
        return self._running.any_running(step) or (reduced is not None and reduced.step == step)

    def disputed_stages(self) -> list[int]:
        """The stages whose two replicas disagree at the step in progress here (placement draws a third there)."""
        return self.disputed[1] if self.disputed[0] == self.runner.step else []

    @property
    def sync_bytes(self) -> int:
        """Contribution bytes this replica sent to other replicas, every phase and attempt."""
        return self.exchange.sync_bytes

    async def start(self) -> None:
        await self.daemon.link.serve(KIND_CONTROL, self._on_command)
        await self.daemon.link.serve(KIND_REDUCE, self._on_reduce)

    # ------------------------------------------------------------------ commands
    async def _on_command(self, body: bytes, sender: str) -> bytes:
        if (refusal := await self.daemon.admitted(sender, KIND_CONTROL)) is not None:
            return refusal
        try:
            cmd = decode_command(body, self.spec.run_hash)
        except WireError as e:
            return self.daemon.refuse(str(e), sender)
        if cmd.op not in ("status", "lease"):  # the others change a step: the leader's right
            if (refusal := await self.daemon.admitted(sender, KIND_DRIVE)) is not None:
                return refusal
        return encode_reply(await self.handle(cmd))

    async def handle(self, cmd: Command, local: bool = False) -> CommandReply:
        """Carry out one command of the driver (also called directly by a driver on this peer: `local`,
        whose apply replies before the state hash is done; `hasher.on_hashed` hears it)."""
        if cmd.op == "reduce":  # the apply of the step before may still be on its way here (StageDaemon.until_step)
            await self.daemon.until_step(cmd.step)
        step, d = self.runner.step, self.daemon
        if cmd.op == "lease":  # read the leader lease again now: it asks nothing else, so anyone may ask
            if self.on_lease is not None:
                await self.on_lease()
            return self._reply(cmd, "ok")
        if cmd.op == "rollback":  # back to the stage's snapshot at cmd.step, wherever this replica is
            if self.on_rollback is None:
                return self._reply(cmd, "failed", "this peer keeps no snapshots.")
            await self.hasher.wait()
            return await self.on_rollback(cmd)
        if cmd.op == "abort" and d.peer_id in cmd.banned and not self.banned.is_set():
            self.ban_reason = cmd.why
            log.error("the leading head banned this peer for the run at step %d: %s; this peer stops", cmd.step + 1,
                      cmd.why or "it gave no reason")
            self.banned.set()  # its owner stops it (swarm/replicas/replica.py): the swarm takes no more of its work
        if cmd.op == "work":  # a head's share of the attempt, or (stage 1) the heads that may feed it
            return await serve_work(d, cmd, self.compute_share)
        if cmd.op == "apply" and cmd.step < step:
            return self._reply(cmd, "ok")  # applied already: a repeat of a command whose reply was lost
        if cmd.step > step and cmd.op in ("reduce", "apply", "abort") and not local and self.on_behind is not None:
            self.on_behind(cmd.step)
        if cmd.step != step:  # "ahead" says whether this replica skipped the step (a new leader finishing it asks)
            return replace(self._reply(cmd, "behind" if cmd.step > step else "ahead", "not at this step."),
                           overflow=cmd.step < step and cmd.step in self.runner.skipped_steps)
        if cmd.op == "status":  # where this peer is: its attempt, or the attempt of a sum it holds for the step
            reduced = self.runner.reduced
            held = reduced is not None and reduced.step == step
            return CommandReply(step, reduced.attempt if held else d.attempt, "ok", self.runner.microbatches_done(),
                                reduced.contributors if held else {})
        if cmd.op == "abort":
            self.disputed = (cmd.step, list(cmd.disputed))
            for peer in cmd.banned:  # convicted by the leader (peer/checks/spot_checks.py)
                if peer != d.peer_id:
                    self.daemon.directory.ban(peer)
            if cmd.attempt >= d.attempt:
                await d.adopt_attempt(cmd.attempt + 1)
            return self._reply(cmd, "ok")
        if cmd.attempt < d.attempt:
            return self._reply(cmd, "failed", "the attempt was superseded here.")
        if cmd.op == "check":  # recompute another replica's share of this attempt (peer/checks/share_check.py)
            held = self._summed[1] if self._summed is not None and self._summed[0] == (cmd.step, cmd.attempt) else {}
            outcome, reason, blame = await self.share_check.check(cmd, held)
            return replace(self._reply(cmd, outcome, reason), blame=blame)
        if cmd.op == "reduce":
            self.clock.start()
            if self.check_record is not None and (problem := await self.check_record(cmd)) is not None:
                signer = getattr(d.link, "signer", None)  # it does not sum with a leader it caught, and signs so
                said = signer.sign(statement(cmd.run, cmd.step, cmd.attempt, cmd.record, problem)) if signer else b""
                return replace(self._reply(cmd, "failed", problem), refusal=said)  # (protocol/refusal.py)
            self.clock.mark("record_check")
            await self.hasher.wait()  # the last step's hash is in (its apply reply sent) before this step's reduce
            self.clock.mark("hash_wait")
            with self._running.running(cmd.step, cmd.attempt):
                await d.adopt_attempt(cmd.attempt)
                return await self._reduce(cmd)
        return await self._apply(cmd, local)

    def _reply(self, cmd: Command, outcome: str, reason: str = "") -> CommandReply:
        reduced, key, reduce = self.runner.reduced, (cmd.step, cmd.attempt), cmd.op == "reduce"
        contributors = reduced.contributors if reduced is not None and (reduced.step, reduced.attempt) == key else {}
        own = self.own_snapshot() if self.own_snapshot is not None and reduce else None
        return CommandReply(cmd.step, cmd.attempt, outcome, self.runner.microbatches_done(), contributors, reason,
                            own, sent=self.daemon.boundary.sent(*key) if reduce else [],
                            blame=self.exchange.blame.get(key, []) if reduce else [],
                            suspects=self._suspects.get(key, []) if reduce else [])

    # ------------------------------------------------------------------ reduce
    async def _reduce(self, cmd: Command) -> CommandReply:
        d = self.daemon
        others = sorted({p for p in cmd.candidates if p != self.peer_id})
        power = self.power if self.spec.powersgd_at(cmd.step) else None  # a warm-up step sums exactly
        if not others and (power is None or (not self.forwarder.followers and await d.run(power.quiet))):
            return await self._reduce_alone(cmd)
        elif power is None:
            mbs, flat, stat, overflow = await d.run(self.runner.share, False)
            self.clock.mark("share")
            mine = Contribution(self.spec.run_hash, cmd.step, cmd.attempt, self.stage, mbs, flat, stat,
                                overflow=overflow)
            got = await self.exchange.exchange(cmd.step, cmd.attempt, mine, others)
            self.clock.mark("exchange")
            try:
                reduced = got if isinstance(got, str) else sum_contributions(cmd.step, cmd.attempt, got,
                                                                             self.spec.n_microbatches)
            except StageError as e:
                reduced = str(e)
            if not isinstance(got, str):  # kept for a spot check of another replica's share
                self._summed = ((cmd.step, cmd.attempt), got)
                far = await d.run(suspects, {p: (len(c.microbatches), c.grads) for p, c in got.items()
                                             if c.grads is not None})
                self._suspects = {(cmd.step, cmd.attempt): far}
        else:
            reduced = await self._reduce_powersgd(cmd, others)
        if isinstance(reduced, str):
            return self._reply(cmd, "failed", reduced)
        if (cmd.step, cmd.attempt) != (self.runner.step, d.attempt):
            return self._reply(cmd, "failed", "the attempt was superseded during the reduce.")
        self.clock.mark("sum")
        await d.run(self.runner.set_reduced, reduced)
        self.exchange.drop(cmd.step, cmd.attempt)
        reply = await self._reduced_reply(cmd)
        self.clock.mark("reply")
        return reply

    async def _reduced_reply(self, cmd: Command) -> CommandReply:  # "ok", and whether the stage overflowed (fp16)
        return replace(self._reply(cmd, "ok"), overflow=await self.daemon.run(self.runner.overflowed))

    async def _reduce_alone(self, cmd: Command) -> CommandReply:
        """The stage's only replica: its accumulated gradients are the sum. They stay where they
        are (on the device); only that every microbatch went through it is checked."""
        mbs = self.runner.microbatches_done()
        if mbs != list(range(self.spec.n_microbatches)):
            return self._reply(cmd, "failed", f"microbatches {sorted(set(range(self.spec.n_microbatches)) - set(mbs))}"
                                              f" of the step did not go through this replica.")
        await self.daemon.run(self.runner.set_reduced, Reduced(cmd.step, cmd.attempt, None, None, {self.peer_id: mbs},
                                                               in_layout=False))
        return await self._reduced_reply(cmd)

    async def _reduce_powersgd(self, cmd: Command, others: list[str]) -> Reduced | str:
        """The two rounds of docs/algorithms.md 5.2; the agreed sum, or why there is none."""
        d, power, run, key = self.daemon, self.power, self.spec.run_hash, (cmd.step, cmd.attempt)
        mbs, flat, stat, overflow = await d.run(self.runner.share, True)
        if overflow:  # fp16: nothing to add, and no round 2 (every replica sees this flag and stops too)
            mine = Contribution(run, cmd.step, cmd.attempt, self.stage, mbs, None, overflow=True)
            got = await self.exchange.exchange(cmd.step, cmd.attempt, mine, others)
            return got if isinstance(got, str) else Reduced(cmd.step, cmd.attempt, None, None,
                                                            {p: c.microbatches for p, c in got.items()}, overflow=True)
        first = await d.run(power.first, flat)
        self.clock.mark("round1")
        # a replica with nothing to add (a standby head, say) sends no tensors: zeros to the others
        mine = Contribution(run, cmd.step, cmd.attempt, self.stage, mbs, None if first.zero else first.exact, stat, 0,
                            None if first.zero else first.P)
        got = await self.exchange.exchange(cmd.step, cmd.attempt, mine, others)
        self.clock.mark("exchange1")
        if isinstance(got, str):
            return got
        try:
            total = sum_contributions(cmd.step, cmd.attempt, got, self.spec.n_microbatches)
        except StageError as e:
            return str(e)
        if total.overflow:  # another replica overflowed: every replica stops after round 1
            return total
        if len(got) == 1 and not self.forwarder.followers:  # alone: nothing to send, so nothing to compress
            flat = await d.run(power.solo, key, first)
            return Reduced(cmd.step, cmd.attempt, flat, total.stat, total.contributors)
        P_sum = sum_factors(got, self.runner.dtype)
        P_hat, Q_mine, Q_flat = await d.run(power.second, first, P_sum)
        self.clock.mark("round2")
        mine = Contribution(run, cmd.step, cmd.attempt, self.stage, [], None, None, 1, None if first.zero else Q_flat)
        got2 = await self.exchange.exchange(cmd.step, cmd.attempt, mine, sorted(p for p in got if p != self.peer_id),
                                           everyone=True)
        self.clock.mark("exchange2")
        if isinstance(got2, str):
            return got2
        Q_sum = sum_factors(got2, self.runner.dtype)
        flat = await d.run(power.finish, key, first, total.grads, P_hat, Q_mine, Q_sum)
        # the sums, on the CPU as they were added up: what a replica catching up is sent (follow_forward.py)
        return Reduced(cmd.step, cmd.attempt, flat, total.stat, total.contributors,
                       factors=(total.grads, P_sum, Q_sum))

    async def _on_reduce(self, body: bytes, sender: str) -> bytes:
        d = self.daemon
        if (refusal := await d.admitted(sender, KIND_REDUCE)) is not None:
            return refusal
        try:
            c = decode_reduce(body, self.limits())
        except BadContribution as e:  # its sender spoils the reduce: the reduce ends at once and names it
            self.exchange.refuse(e.step, e.attempt, e.phase, sender, str(e))
            return d.refuse(str(e), sender)
        except WireError as e:
            return d.refuse(str(e), sender)
        if isinstance(c, InputsRequest):
            return self.share_check.serve(c)
        await d.until_step(c.step)  # as the reduce command: a sibling may start the next step's reduce first
        if isinstance(c, ReduceProbe):
            return encode_probe_reply(self._running.state(c.step, c.attempt, (self.runner.step, d.attempt)))
        return self.exchange.receive(c, sender)

    # ------------------------------------------------------------------ apply
    async def _apply(self, cmd: Command, local: bool = False) -> CommandReply:
        d = self.daemon
        reduced = self.runner.reduced
        if reduced is None or (reduced.step, reduced.attempt) != (cmd.step, cmd.attempt):
            if cmd.step == self.runner.step and not local and self.on_behind is not None:
                self.on_behind(cmd.step + 1)  # the swarm applies a step this replica holds no sum of: left out of it
            return self._reply(cmd, "failed", "no reduced gradient is held for this attempt.")
        await self.hasher.wait()  # the step changes the state the last hash reads
        done = await d.run_step(self._apply_job, cmd.step, cmd.attempt, cmd.skip)
        # the worker, in order with what was queued before it, found the step applied meanwhile (a repeat of
        # this apply that got there first while the hash ran, a forwarded step) or the sum gone (an abort)
        if isinstance(done, str):
            return self._reply(cmd, "ok" if done == APPLIED_MEANWHILE else "failed", done)
        stats, record, due = done
        if due is not None:  # hashed on a thread from now on; the next microbatches need not wait for it
            self.hasher.start(*due)
        self.records.append(record)
        self.last_applied = (cmd.step, cmd.attempt)
        if cmd.candidates:  # the leader names the replicas of every stage that took part in this step's reduce
            self.workers = list(cmd.candidates)
        if cmd.skip:
            log.warning("stage %d: step %d skipped: an fp16 gradient overflowed in the swarm; loss scale now %g",
                        self.stage, cmd.step + 1, self.runner.scale)
        self.last_sync_bytes = self.exchange.attempt_bytes(cmd.step, cmd.attempt)
        self.synced_steps += len(reduced.contributors) > 1
        self.forwarder.forward(reduced, cmd.skip)
        d.stepped()
        if self.on_applied is not None:
            self.on_applied(self.runner.step)
        if stats is not None and d.on_refit is not None:
            d.spawn(d.on_refit(stats))
        state = None
        if due is not None and not local:  # a replica's apply reply carries its hash: the leader tallies it
            await self.hasher.wait()
            state = self.hasher.last
        return CommandReply(cmd.step, cmd.attempt, "ok", [], reduced.contributors, state=state)

    def _apply_job(self, step: int, attempt: int, skip: bool):
        # checked again on the worker: between the check in `_apply` and this job, a forwarded step
        # (peer/state/state_transfer.py) or an abort queued ahead of it may have taken the step or the sum
        if self.runner.step > step:
            return APPLIED_MEANWHILE
        r = self.runner.reduced
        if r is None or (r.step, r.attempt) != (step, attempt):
            return "no reduced gradient is held for this attempt."
        if self.forwarder.followers and r.grads is None and not skip:  # a joiner needs it in full
            _, flat, stat = self.runner.contribution(False, False)
            # a copy: on the CPU the statistic is the step's accumulator itself, which the step zeroes
            r.grads, r.stat = flat, None if stat is None else stat.clone()
        record = self.runner.apply_reduced(step, attempt, skip)
        if self.power is not None:  # a skipped step keeps the error feedback and Q it had
            self.power.discard() if skip else self.power.commit(step, attempt)
        stat, steps = self.daemon.refit_statistic(), self.runner.step
        # the state as it is now (tensors by reference: no step changes them before the hash is done)
        return stat, record, (steps, self.runner.state_dict()) if self.hasher.due(steps) else None

"""`ReplicaService`: this process serving one stage as one of its replicas, over libp2p.

It builds the stage's `StagePeer`, gets the stage's state (`swarm/replicas/state_source.py`),
announces itself, beats the heartbeat, writes checkpoints (atomically, every
`checkpoint_every` steps and when it stops), drives steps if it is a head, and every
`rebalance_period` asks `swarm/replicas/placement.py` whether it should move to another stage
(never within `rebalance_hold` of taking this one, unless a stage is empty).
`serve()` returns the stage to move to, or None when it is done.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

from peer.checks.boundary_evidence import BY_SIGNATURE
from peer.checks.vouched_state import VouchedStates
from peer.daemon.transfer_time import TOO_SLOW
from peer.replica.stage_peer import StagePeer
from peer.runner.checkpoint import checkpoint_path, save_checkpoint
from peer.runner.memory_estimate import estimate_stage
from peer.runner.replica_sync import flat_limits
from peer.runner.stage import StageRunner
from peer.state.state_transfer import state_bytes
from peer.step.driver import StepLog
from protocol.boundary_sig import MAX_OVERHEAD
from protocol.spec import RunSpec
from protocol.state_wire import STATE_CHUNK_BYTES
from protocol.wire import (
    KIND_ACTIVATION,
    KIND_BASIS,
    KIND_CONTROL,
    KIND_FOLLOW,
    KIND_GRADIENT,
    KIND_REDUCE,
    KIND_SNAPSHOT,
    KIND_STATE,
    WireLimits,
)
from swarm.basis import BasisSync
from swarm.dht import SwarmDHT
from swarm.monitor.liveness import LivenessProbe
from swarm.net import Transport
from swarm.net.transport import MAX_LENGTH_FIELD
from swarm.trust.signed_records import sign_record
from swarm.user_errors import Refused

from .data_check import StepRecordCheck
from .head_vouched import HeadVouches
from .membership import PROBE_S, Membership
from .own_state import BehindCheck, OwnStateCheck
from .placement import HOLD_S, Rebalancer
from .router import Router
from .state_source import StateSource
from .vouched import coordinator_vouches, vouched_hashes, vouched_states
from .work_records import WorkRecords

log = logging.getLogger(__name__)

SERVED_KINDS = (KIND_ACTIVATION, KIND_GRADIENT, KIND_BASIS, KIND_CONTROL, KIND_REDUCE, KIND_FOLLOW, KIND_STATE,
                KIND_SNAPSHOT)


def given(**options: object) -> dict[str, object]:
    """The options that were set (not None): the others keep the daemon's or driver's default."""
    return {k: v for k, v in options.items() if v is not None}


def snapshot_interval(spec: RunSpec) -> int:
    """Steps between snapshots of every stage, as the coordinator sealed it into the spec (0: none)."""
    return int(spec.extra.get("snapshot_every", 0))


def frame_limits(spec: RunSpec, runner: StageRunner) -> dict[str, int]:
    """The largest request a replica of this stage accepts, per kind of message."""
    boundary = WireLimits.for_spec(spec).max_bytes + MAX_OVERHEAD  # the sender's signature in front
    flat = flat_limits(spec, runner).max_bytes
    return {KIND_ACTIVATION: boundary, KIND_GRADIENT: boundary, KIND_BASIS: spec.d_model * spec.rank * 4 + 4096,
            KIND_CONTROL: 16 << 10, KIND_REDUCE: flat, KIND_FOLLOW: flat, KIND_STATE: 4096,
            KIND_SNAPSHOT: 4096}


def transport_limit(spec: RunSpec) -> int:
    """The largest frame any replica of this run sends or receives (replies included)."""
    # counted from the spec: building every stage to count would take paper8b's 8e9 parameters into memory
    runners = max(estimate_stage(spec, s).params for s in range(spec.n_stages))
    # a frame's length field is 32 bits: a stage past ~5e8 parameters (`large` in one stage) is capped there,
    # and a frame over the cap fails with its size named (powersgd's reduce is far below it)
    return min(max(WireLimits.for_spec(spec).max_bytes, STATE_CHUNK_BYTES + 4096, 8 * runners + (1 << 20)),
               MAX_LENGTH_FIELD)


class PeerBanned(RuntimeError):
    """The leading head banned this peer for the run (peer/checks/spot_checks.py): its message says why,
    and what to do."""


def ban_message(why: str, floor_bps: float) -> str:
    """What a banned peer's owner is told: the leader's reason, and what to do about it. A replica cut for being
    slower than the swarm waits for is told that, not that its work was false."""
    said = f"the leading head banned this peer for the run: {why.rstrip('.') or 'it gave no reason'}. "
    if TOO_SLOW in why:
        return said + (f"This peer's uplink is slower than the swarm waits for ({floor_bps / 1e6:g} Mbit/s, its run "
                       "spec's slowest uplink): join from a faster connection, or a swarm whose coordinator sets a "
                       "lower --slowest-uplink. This peer id stays banned in this run, so start it with a new one "
                       "(swarm peer --identity NEW_FILE), or ask the swarm's operator to lift the ban (swarm unban).")
    if BY_SIGNATURE in why:
        return said + ("Its reports of the boundary messages it sent or took contradict what their senders signed: "
                       "that is a modified peer; run the released `swarm peer` (with a new --identity: this id stays "
                       "banned in this run).")
    return said + ("If its work was recomputed to other numbers, that is tampering, or a GPU, driver or overclock that "
                   "computes wrongly: check the card (swarm bench share-tolerance), then ask the swarm's operator to "
                   "lift the ban (swarm unban PEER_ID) and start it again with the same --identity.")


@dataclass
class ReplicaContext:
    """What every stage this process serves shares: the run, the network, where to report."""

    spec: RunSpec
    peer_id: str
    sdht: SwarmDHT
    transport: Transport
    router: Router
    link: object  # a MessageLink over `transport`
    device: str
    batches: object | None  # head data source (stage 0), built lazily by the caller
    report: object  # Reporter
    monitor: object  # PeerMonitor
    ttl: float
    checkpoint_dir: str | None
    checkpoint_every: int
    resume: bool
    rebalance_period: float
    steps: int | None
    step_timeout: float
    reachability: str = "direct"  # or "relayed": how others reach this peer
    linger: bool = False  # a head keeps serving after its last step
    rebalance_hold: float = HOLD_S  # seconds a peer stays at a stage it took, unless a stage is empty
    min_step_timeout: float | None = None  # the driver's floor for a later step's timeout (None: its default)
    next_step_wait: float | None = None  # how long the daemon holds a next-step message (None: its default)
    allow_fresh_stage: bool = False  # a stage nobody holds a snapshot of may start from its initial weights
    allowed_stages: frozenset[int] | None = None  # the stages that fit this peer's memory (None: all)
    checkpointing: bool = False  # activation checkpointing per block (peer/runner/stage.py)
    compile_blocks: bool = False  # torch.compile each block of the stage (peer/runner/stage.py)
    spot_check_rate: float | None = None  # the share of replicas' work a leader recomputes (None: its default)
    probation_seats: int | None = None  # a leader's reduce seats beyond the members that work (None: its default)
    on_stage_peer: Callable[[StagePeer], None] | None = None  # an extension point: `run_peer` (swarm/node.py)


class ReplicaService:
    def __init__(self, ctx: ReplicaContext, stage: int) -> None:
        self.ctx, self.stage = ctx, stage
        self.spec = ctx.spec
        self.runner: StageRunner | None = None
        self.peer: StagePeer | None = None
        self.sync: BasisSync | None = None
        self._saving: asyncio.Task | None = None
        # the hold starts now. No liveness probe of the directory: a live peer whose uplink is busy (a snapshot
        # over 1 Mbit/s) can miss one, and a stage that looks empty draws a peer away at once; only the peers
        # that would stay are probed, once a move is decided (a missed probe puts the move off: placement.py)
        # it counts the peers the leader's apply names, not the announced ones (placement.py)
        self.rebalancer = Rebalancer(ctx.router, ctx.spec, ctx.rebalance_hold, allowed=ctx.allowed_stages,
                                     keeper_probe=self._answers,
                                     workers=lambda: self.peer.commit.workers if self.peer is not None else None,
                                     disputed=lambda: self.peer.commit.disputed_stages() if self.peer else [])

    async def serve(self) -> int | None:
        ctx = self.ctx
        self.runner = runner = await asyncio.to_thread(StageRunner, self.spec, self.stage, ctx.device,
                                                       checkpointing=ctx.checkpointing,
                                                       compile_blocks=ctx.compile_blocks)
        self.sync = sync = BasisSync(self.spec, ctx.sdht, ctx.transport)
        batches = ctx.batches() if self.stage == 0 else None
        membership = Membership(ctx.router, ctx.sdht, self.stage, self.spec.n_stages, probe=self._answers)
        self.peer = peer = StagePeer(
            runner, ctx.link, ctx.router, batches=batches, verify_state=sync.verify_state,
            daemon_options=dict(on_refit=sync.send_stats, verify_update=sync.verify, pull_updates=sync.pull,
                                admit=membership.check,
                                **given(future_step_wait=ctx.next_step_wait)),
            driver_options=dict(first_timeout=ctx.step_timeout, sign_record=sign_record(ctx.sdht.identity),
                                **given(min_timeout=ctx.min_step_timeout, spot_check_rate=ctx.spot_check_rate,
                                       probation_seats=ctx.probation_seats)),
            # every stage snapshots at the same steps: the interval is the coordinator's, in the signed spec
            snapshot_options=dict(every=snapshot_interval(self.spec)))
        sync.daemon = peer.daemon
        peer.daemon.gate.updates_come = sync.updates_come  # no 30 s wait per switch step with no coordinator
        membership.named = peer.daemon.named_heads  # stage 1: heads named for the attempt (peer/commit/head_work.py)
        peer.commit.on_lease = lambda: ctx.router.lease(fresh=True)  # the coordinator revoked a lease
        # with no coordinator in the seat: the hashes the lease's heads signed (swarm/replicas/head_vouched.py)
        heads = HeadVouches(ctx.sdht, self.spec.run_hash, self.spec.n_stages, ctx.router.lease)
        peer.snapshots.vouched = lambda: vouched_hashes(ctx.sdht, self.spec.run_hash, self.stage, sync.coordinator,
                                                        heads)
        # a coordinator with --checkpoint-dir holds the vouched snapshots too (swarm/replicas/checkpoint_keeper.py):
        # the seat's holder and the other coordinators with live claims (the spec's coordinator_peer before any claim)
        peer.snapshots.extra_holders = sync.coordinator.peer_ids
        states = lambda: vouched_states(ctx.sdht, self.spec.run_hash, self.stage, sync.coordinator,  # noqa: E731
                                        heads)
        # a joiner loads only a state whose hash the swarm key vouches for (no coordinator: a lease head signed)
        peer.vouched = VouchedStates(states, every=peer.commit.hasher.every,
                                     unchecked=lambda: coordinator_vouches(sync.coordinator))
        peer.state.hashed_only = bool(self.spec.extra.get("coordinator_peer"))  # and a donor serves such a state
        self.source = StateSource(ctx, self.stage, peer, sync, self._answers)
        self.own_check = OwnStateCheck(peer, states, self._resync, ctx.report)
        peer.commit.hasher.on_hashed.append(lambda state: self.own_check.after_step(state[0]))  # once its hash is in
        self.behind_check = BehindCheck(peer, self._resync, ctx.report)
        peer.state.catching_up = lambda: self.source.resyncing  # downloading the state itself: no donor meanwhile
        records = WorkRecords(self.spec, ctx, sync, peer.daemon.spawn)  # to the coordinator, which vouches
        if peer.driver is not None:
            peer.driver.on_committed = records.after_commit
            peer.driver.votes.on_agreed = records.vouch_states
            peer.rollback.before = records.before_rollback
            peer.driver.report_refusal = records.report_refusal  # a head's signed refusal: the coordinator judges
        # a ban the swarm key lifts (`swarm unban`): this head, if it leads, no longer names the peer in its aborts
        ctx.router.run_bans.on_pardon[:] = [peer.driver.spot.pardon] if peer.driver is not None else []
        if batches is not None:  # a head: it sums only with a leader whose step records its own data confirms
            peer.commit.check_record = StepRecordCheck(
                self.spec.run_hash, self.spec.n_microbatches, batches, records.report_step_record,
                on_bad=lambda r: ctx.report.write("bad_step_record", leader=r.leader, step=r.step + 1), me=ctx.peer_id)
        if ctx.on_stage_peer is not None:  # the peer wired, not yet started: what it changes holds from the start
            ctx.on_stage_peer(peer)
        ctx.link.limits.update(frame_limits(self.spec, runner))
        heartbeat = None
        try:
            await peer.start()
            await self.source.acquire()
            peer.on_applied = self._after_step
            peer.commit.on_behind = self.behind_check.behind  # from now on: a joiner's own download is done
            await peer.announce("online")
            ctx.monitor.attach(ctx.sdht, self.spec, ctx.peer_id, ctx.router.maddrs, ctx.transport, peer.daemon,
                               ctx.router, ctx.device, peer.commit)
            heartbeat = asyncio.create_task(self._heartbeat())
            log.info("peer %s serves stage %d of run %s", ctx.peer_id, self.stage, self.spec.run_hash)
            ctx.report.write("ready", stage=self.stage, peer_id=ctx.peer_id, run=self.spec.run_hash,
                             maddrs=ctx.router.maddrs, step=runner.step, reachability=ctx.reachability)
            if peer.driver is not None:
                ctx.report.write("start", step=runner.step)
                # a standby head rebalances too (the leader never is the one that moves: placement.py)
                drive = asyncio.create_task(peer.drive(ctx.steps, self._on_step))
                move = asyncio.create_task(self._until_moved_or_banned())
                try:
                    await asyncio.wait({drive, move}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    # the loser, or both on Ctrl+C: the driver must be done before _leave stops the
                    # daemon under it, and no task may outlive this one (its error would go unread)
                    moved = not drive.done()  # the driver finishing wins a tie: its steps are done
                    for task in (drive, move):
                        task.cancel()
                    await asyncio.gather(drive, move, return_exceptions=True)
                if moved:
                    return move.result()
                drive.result()  # what the driver raised, if anything
                ctx.report.write("done", steps=runner.step)
                if not ctx.linger:
                    return None
            return await self._until_moved_or_banned()
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
            await self._leave()

    async def _resync(self, swarm_step: int | None = None) -> None:
        """This replica's state differs from the vouched one, or it fell behind (the swarm at `swarm_step`):
        download the stage's state again (its first hashed step after is checked against the records)."""
        self.own_check.checked = 0
        await self.source.resync(swarm_step)

    async def _answers(self, peer: str) -> bool:
        """Whether `peer` answers a status request at all (a refusal is an answer): a liveness probe."""
        return await LivenessProbe(self.ctx.transport.p2p, PROBE_S).answers(self.spec.run_hash, peer,
                                                                             self.ctx.transport)

    # ------------------------------------------------------------------ while serving
    def _on_step(self, record: StepLog) -> None:
        transport, daemon = self.ctx.transport, self.peer.daemon
        wire = transport.bytes_sent(KIND_ACTIVATION) / max(1, daemon.sent_tokens[KIND_ACTIVATION])
        self.ctx.report.write("step", **asdict(record), forward_bytes_per_token=wire)
        log.info("step %d loss %.4f %.0f tok/s%s", record.step, record.loss, record.tokens / max(record.seconds, 1e-9),
                 f" ({record.attempts} attempts)" if record.attempts > 1 else "")

    def _after_step(self, step: int) -> None:
        check = self.peer.commit.check_record
        if isinstance(check, StepRecordCheck) and not self.peer.daemon.leads:  # a standby head: the next reduce's
            check.prepare(step)
        if self.ctx.checkpoint_dir and self.ctx.checkpoint_every and step % self.ctx.checkpoint_every == 0:
            if self._saving is None or self._saving.done():
                self._saving = asyncio.create_task(self.save_checkpoint())

    async def save_checkpoint(self) -> None:
        """Snapshot on the worker thread (between two steps), write atomically off the event loop. A write
        that fails is an error on the console, in the report and in the health record, and the peer goes on
        (the next write may succeed; the last one, at `_depart`, must)."""
        path = checkpoint_path(self.ctx.checkpoint_dir, self.spec.run_hash, self.stage)
        data = await self.peer.daemon.run(lambda: state_bytes(self.runner.state_dict()))
        try:
            await asyncio.to_thread(save_checkpoint, path, data)
        except OSError as e:
            self._checkpoint_failed(path, e)

    def _checkpoint_failed(self, path, e: OSError) -> str:
        why = (f"could not write stage {self.stage}'s checkpoint at step {self.runner.step} to {path} "
               f"({e.strerror or e}); free space or fix the folder's permissions, or this stage's state is not saved.")
        log.error("%s", why)
        self.ctx.report.write("checkpoint_error", stage=self.stage, step=self.runner.step, error=why)
        if hasattr(self.ctx.monitor, "checkpoint_error"):
            self.ctx.monitor.checkpoint_error = why
        return why

    async def _heartbeat(self) -> None:
        await self.ctx.monitor.publish(self.ctx.ttl)  # at once, so that dashboards see the peer without waiting
        while True:
            await asyncio.sleep(self.ctx.ttl / 3)
            await self.ctx.monitor.publish(self.ctx.ttl)  # never raises: a failed publish is retried next beat
            try:
                await self.peer.announce()
                await self.sync.pull()
            except Exception as e:  # a DHT hiccup must not kill the peer; the next beat retries
                log.warning("heartbeat failed: %s", e)

    async def _until_moved_or_banned(self) -> int:
        """`_serve_until_moved`, or PeerBanned once the leader's abort names this peer as convicted."""
        move = asyncio.create_task(self._serve_until_moved())
        banned = asyncio.create_task(self.peer.commit.banned.wait())
        try:
            await asyncio.wait({move, banned}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (move, banned):
                task.cancel()
            await asyncio.gather(move, banned, return_exceptions=True)
        if not move.done() or move.cancelled():
            self.ctx.report.write("banned", stage=self.stage, step=self.runner.step)
            raise PeerBanned(ban_message(self.peer.commit.ban_reason, self.ctx.spec.slowest_uplink_bps))
        return move.result()

    async def _serve_until_moved(self) -> int:
        period = self.ctx.rebalance_period
        while True:
            await asyncio.sleep(period if period > 0 else 3600.0)  # the rebalance period: a schedule, not a wait
            if period <= 0:
                continue
            target = await self.rebalancer.target(self.stage)
            if target is not None and target != self.stage:
                log.info("moving from stage %d to stage %d to balance the swarm", self.stage, target)
                self.ctx.report.write("moved", stage=self.stage, to=target)
                return target

    async def _leave(self) -> None:
        """Leave the stage and save its checkpoint. A stop that arrives while this is under way (a SIGTERM
        during a move to another stage: the departure had begun) lets it finish: the stage's state is
        written before the process goes; only a second stop cuts it short."""
        if self.peer is None:
            return
        departure = asyncio.ensure_future(self._depart())
        try:
            await asyncio.shield(departure)
        except asyncio.CancelledError:
            if not departure.done():
                log.info("stopping: finishing leaving stage %d first (its checkpoint)", self.stage)
                await departure
            raise

    async def _depart(self) -> None:
        ctx, peer = self.ctx, self.peer
        try:
            await asyncio.wait_for(peer.announce("leaving"), 3.0)
        except Exception:  # leaving is best effort: the record expires anyway
            pass
        log.info("leaving stage %d at step %d", self.stage, self.runner.step)
        for kind in SERVED_KINDS:
            await ctx.transport.unserve(kind)
        await peer.stop()
        if self._saving is not None:
            await asyncio.gather(self._saving, return_exceptions=True)
        if ctx.checkpoint_dir:
            path = checkpoint_path(ctx.checkpoint_dir, self.spec.run_hash, self.stage)
            try:
                save_checkpoint(path, state_bytes(self.runner.state_dict()))
            except OSError as e:  # the peer leaves with this one sentence and exit code 1 (swarm/user_errors.py)
                raise Refused(self._checkpoint_failed(path, e)) from None
            log.info("saved stage %d at step %d to %s", self.stage, self.runner.step, path)

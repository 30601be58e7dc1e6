"""`StateSource`: where a replica of a stage gets the stage's state, when it starts and when it must
get it again.

At the start, in this order: a stage whose live replicas all announce step 0 (the swarm has not
stepped) needs nothing, since every replica builds the same initial state from the signed spec's
seed; else the state is downloaded from a live replica (vouched by the swarm key's records,
`peer/replica/stage_peer.py` `join`); else this peer's checkpoint with `--resume`; else, if the swarm has
trained, the stage's newest snapshot that peers of other stages hold, after which the swarm rolls
back to it (before the swarm's first snapshot: the stage's initial state, and the swarm rolls back
to step 0); with no snapshot anywhere it waits, the swarm paused, unless `--allow-fresh-stage` lets
the stage start from its initial weights at the swarm's step. A swarm that has not trained at all
starts afresh. Later, `resync` downloads the state again (a replica whose hash differs from the
vouched one, or one the swarm went on without: swarm/replicas/own_state.py); a replica with no other
replica to download from is its stage's only one, and restores it as a peer that takes an emptied
stage does (a replica that started at step 0 because the announcements it read were not yet past it
is refilled so too); so does one whose every donor failed and none of them answers any more (the donor
died mid-download: seen when the churn bench killed the leading head while the other head of its stage
was downloading from it; that head then went on with its behind state, would not lead, and the swarm
stood still for good).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from peer.replica.stage_peer import StagePeer
from peer.runner.checkpoint import checkpoint_path, load_checkpoint
from peer.state.snapshots import NoSnapshot
from peer.state.state_transfer import StateError
from swarm.basis import BasisSync

from .swarm_step import newest_vouched_step, swarm_step

log = logging.getLogger(__name__)

RESTORE_RETRY_S = 5.0  # how often a peer waiting for a snapshot of its emptied stage asks again


class StateSource:
    def __init__(self, ctx, stage: int, peer: StagePeer, sync: BasisSync,
                 answers: Callable[[str], Awaitable[bool]] | None = None) -> None:
        # ctx: a ReplicaContext; answers(peer): whether a peer answers at all (a liveness probe), if one can be sent
        self.ctx, self.stage, self.peer, self.sync, self.answers = ctx, stage, peer, sync, answers
        self.spec, self.runner = ctx.spec, peer.runner
        self.resyncing = False

    async def acquire(self) -> None:
        """The stage's state at the start (the order is the module's)."""
        ctx, peer, runner = self.ctx, self.peer, self.runner
        path = checkpoint_path(ctx.checkpoint_dir, self.spec.run_hash, self.stage) if ctx.checkpoint_dir else None
        donors = await self._donors()
        if runner.step == 0 and donors and all(a.step == 0 for a in donors):
            # every replica's state is the one built from the signed spec's seed (on the CPU, then moved), this
            # one's too, so none is downloaded (`large`: 9.7 GB a stage). Had a step been applied meanwhile, the
            # leader's next command finds this replica behind, and it downloads then (BehindCheck)
            log.info("stage %d: the swarm has not stepped yet; this replica starts from the initial state, "
                     "which every replica builds from the spec's seed", self.stage)
        elif await self._download(donors):
            return
        elif ctx.resume and path is not None and path.exists():
            state = await asyncio.to_thread(load_checkpoint, path)
            await peer.daemon.run(runner.load_state_dict, state)
            log.info("resumed stage %d at step %d from %s", self.stage, runner.step + 1, path)
        else:
            at = await self._swarm_step()
            if at:
                await self._restore(at)
        await self.sync.catch_up(peer.daemon)
        peer.daemon.stepped()

    async def resync(self, swarm_step: int | None = None) -> None:
        """Download the stage's state again from a live replica; with none that gives one, go on with its own;
        with none at all, restore the stage (the swarm's step: `swarm_step`, the leader's word, else read from
        the swarm). Once at a time: both checks of own_state.py may find a replica astray at once."""
        if self.resyncing:
            return
        self.resyncing = True
        try:
            donors = await self._donors()
            if not await self._download(donors):
                if donors and await self._any_answers(donors):
                    log.error("stage %d: no replica gave a vouched state; this replica goes on with its own",
                              self.stage)
                else:  # the stage's only replica, or its donors are gone: refilled as an emptied stage is
                    gone = ("no replica that could give the stage's state answers any more (its donor left "
                            "mid-download)") if donors else "no other replica holds the stage's state"
                    log.warning("stage %d: %s; this replica restores the stage's newest snapshot and the swarm rolls "
                                "back to it", self.stage, gone)
                    await self._restore(swarm_step if swarm_step is not None else await self._swarm_step())
            await self.peer.announce("online")
        finally:
            self.resyncing = False

    async def _donors(self) -> list:
        return [a for a in await self.ctx.router.live_peers(self.stage, fresh=True) if a.peer_id != self.ctx.peer_id]

    async def _any_answers(self, donors: list) -> bool:
        """Whether any of the donors still answers a liveness probe (True when no probe can be sent)."""
        if self.answers is None:
            return True
        return any(await asyncio.gather(*(self.answers(a.peer_id) for a in donors)))

    async def _download(self, donors: list) -> bool:
        """Join from a live replica of the stage (the first in order of announced step and throughput that
        gives a vouched state); False if there is none, or none gave one."""
        if not donors:
            return False
        await self.peer.announce("syncing")
        order = [a.peer_id for a in sorted(donors, key=lambda a: (-a.step, -a.throughput, a.peer_id))]
        try:
            donor = await self.peer.join(order, announced={a.peer_id: a.step for a in donors})
        except StateError as e:
            log.warning("%s; starting from this peer's own state instead", e)
            return False
        self.ctx.report.write("joined", stage=self.stage, donor=donor, step=self.runner.step)
        return True

    async def _restore(self, at: int) -> None:
        """The stage lost every replica after the swarm trained (it is at step `at`): load its newest
        snapshot (the swarm then rolls back to it, `peer/state/rollback.py`). With none anywhere, start afresh
        only if the owner said so (`--allow-fresh-stage`); else wait, the swarm paused, until a
        snapshot's holder is back."""
        ctx, peer, runner = self.ctx, self.peer, self.runner
        await peer.announce("syncing")
        said = False
        while True:
            try:
                step = await peer.restore(swarm_step=at)  # the step the swarm key's records support
            except NoSnapshot as e:
                if ctx.allow_fresh_stage:
                    log.warning("stage %d had no live replica and no peer holds a snapshot of it: the stage starts "
                                "again from its initial weights, at the swarm's step %d (--allow-fresh-stage)",
                                self.stage, at + 1)
                    ctx.report.write("fresh_stage", stage=self.stage, step=at)
                    runner.step = at
                    return
                if not said:
                    log.error("stage %d: %s", self.stage, e)
                    ctx.report.write("waiting_for_snapshot", stage=self.stage, swarm_step=at)
                    said = True
                await asyncio.sleep(RESTORE_RETRY_S)  # the retry schedule: a holder may come back
                await peer.announce("syncing")  # the heartbeat does not run yet
                continue
            source = f"its snapshot at step {step}" if step else "its initial state (the swarm has no snapshot yet)"
            log.warning("stage %d had no live replica: restored from %s; the swarm is at step %d, so every stage rolls "
                        "back to step %d and the steps after it are driven again", self.stage, source, at, step)
            ctx.report.write("restored", stage=self.stage, step=step, swarm_step=at)
            return

    async def _swarm_step(self) -> int:
        """The step the swarm is on, for a stage that had no live replica: from the other peers' announced
        steps, those the swarm key's records support (swarm/replicas/swarm_step.py)."""
        ctx, spec = self.ctx, self.spec

        async def others() -> list:
            return [a for s in range(spec.n_stages) for a in await ctx.router.live_peers(s, fresh=True)
                    if a.peer_id != ctx.peer_id]

        return await swarm_step(others, ctx.router.lease_order, lambda: newest_vouched_step(ctx.sdht, spec.run_hash),
                                ctx.ttl, self.stage)

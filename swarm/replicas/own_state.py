"""`OwnStateCheck`: a replica compares its own state hash with the one the swarm key vouches for
(issue 21, item 4), and downloads the stage's state again when they differ.

It checks the first step it applies in a reduce after it started or joined (so a joiner learns
at once that what it loaded and caught up on is the swarm's state: the hash it reports after
that step is the one the record holds), and then every `every` steps: the leader already takes
a replica whose hash differs out of the stage (`peer/checks/state_votes.py`); this is how an honest
replica that went astray (a bad download, a bit flip) finds out and comes back by itself.
Each check is one read of the DHT record; the hash itself is computed at the apply anyway.
Steps this replica drives again after a rollback (T+1..S, `Rollback.redriven`) are not checked: they
need not be the first drive's bits, and their record is the first drive's until the coordinator drops it
(the leader tells it first; a coordinator away never hears it). Before, such a check found the state
"differs", downloaded it again, found no donor, restored step 0, and the swarm rolled back again.

`BehindCheck`: a replica the swarm left behind (it missed a step's reduce: set aside at a missed
deadline under load, a stall) hears a reduce or apply of a later step. Nothing would bring it
level: the leader commands only replicas at the step, so it would stand by for ever, its GPU idle
and its stage one replica short. Unless it gets level by itself (the apply of the step before may
be on its way; a joiner applies its donor's forwarded sums), with no `grace` seconds passing
without a step applied, it downloads the stage's state again. With nothing on its way (no donor whose
forwarded sums it follows, and two steps or more behind or no sum of its step made or held here),
nothing can bring it level by itself: it waits only `LEFT_BEHIND_S`, asked again while it waits (the
swarm may move on). A standby head that started from the seed as the swarm took its first step (churn
smoke, CI) waited the whole grace, twice (one step behind when told, then left out of that step's
reduce too), the only up-to-date replica of its stage died meanwhile, and the swarm rolled back to step 0.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from peer.replica.stage_peer import StagePeer

log = logging.getLogger(__name__)

CHECK_EVERY = 10  # steps between a replica's checks of its own state hash, after the first
WAIT_S = 60.0  # how long a check waits for the record of its step (it comes through the coordinator)
BEHIND_GRACE_S = 10.0  # how long a replica told of a later step waits to get level by itself
LEFT_BEHIND_S = 1.0  # the same for a replica 2+ steps behind that follows no donor: no apply is on its way


class OwnStateCheck:
    def __init__(self, peer: StagePeer, hashes: Callable[[], Awaitable[dict[int, str]]],
                 resync: Callable[[], Awaitable[None]], report, every: int = CHECK_EVERY,
                 wait: float = WAIT_S) -> None:
        self.peer, self.hashes, self.resync, self.report = peer, hashes, resync, report
        self.every, self.wait = every, wait
        self.checked = 0  # the steps of the last state checked (0: none yet)
        self._running = False

    def after_step(self, steps: int) -> None:
        """The stage applied its `steps`-th step: check its hash if one was taken and a check is due."""
        state = self.peer.commit.hasher.last
        due = self.checked == 0 or steps - self.checked >= self.every
        if state is None or state[0] != steps or not due or self._running:
            return
        undone, redone = self.peer.rollback.redriven
        if undone < steps <= redone:  # a step driven again after a rollback: not the first drive's bits, maybe
            return  # not yet the record's either (a coordinator away); the first step past them is checked
        self.checked, self._running = steps, True
        self.peer.daemon.spawn(self._check(*state))

    async def _check(self, steps: int, sha256: str) -> None:
        try:
            await self._compare(steps, sha256)
        finally:
            self._running = False

    async def _compare(self, steps: int, sha256: str) -> None:
        deadline = time.monotonic() + self.wait
        while True:
            known = await self.hashes()
            if steps in known or (known and min(known) > steps) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)  # the record of this step is on its way through the coordinator
        vouched = known.get(steps)
        if vouched is None:
            log.info("stage %d: no record vouches for step %d; this replica's state there is not checked",
                     self.peer.runner.stage, steps)
            return
        self.report.write("state_checked", stage=self.peer.runner.stage, step=steps, sha256=sha256,
                          vouched=vouched, agrees=vouched == sha256)
        if vouched == sha256:
            log.info("stage %d: this replica's state after step %d is the one the swarm vouches for",
                     self.peer.runner.stage, steps)
            return
        log.warning("stage %d: this replica's state after step %d differs from the one the swarm vouches for; it "
                    "downloads the stage's state again", self.peer.runner.stage, steps)
        self.checked = 0  # the state downloaded next is checked at its first step
        await self.resync()


class BehindCheck:
    def __init__(self, peer: StagePeer, resync: Callable[[int], Awaitable[None]], report,
                 grace: float = BEHIND_GRACE_S) -> None:
        """`resync(swarm_step)`: get the stage's state again; the swarm's step is the leader's word (its
        commands are admitted from the leading head only)."""
        self.peer, self.resync, self.report, self.grace = peer, resync, report, grace
        self.resyncs = 0
        self.swarm_step = -1  # the latest step of the leader's commands heard here since the last rollback
        self._rolled = self._rollbacks()
        self._running = False

    def _rollbacks(self) -> int:
        return getattr(getattr(self.peer, "rollback", None), "rollbacks", 0)

    def behind(self, swarm_step: int) -> None:
        """A command of step `swarm_step` came while this replica is at an earlier one."""
        if self._rollbacks() != self._rolled:  # the swarm rolled back: the steps heard before are undone
            self.swarm_step, self._rolled = -1, self._rollbacks()
        self.swarm_step = max(self.swarm_step, swarm_step)  # a wait under way sees the swarm move on
        if self._running:
            return
        self._running = True
        self.peer.daemon.spawn(self._catch_up())

    def patience(self) -> float:
        """How long, with no step applied here, this replica waits to get level by itself:

            grace          if its donor forwards it sums (a joiner), or the swarm is one step ahead and this
                           replica's sum of its step is being made or held (the apply may be on its way)
            LEFT_BEHIND_S  otherwise: nothing is on its way (2+ steps behind, or left out of its step's reduce)"""
        on_its_way = self.peer.follower.donor is not None or (
            self.swarm_step - self.peer.runner.step < 2 and self.peer.commit.sum_on_its_way())
        return self.grace if on_its_way else min(self.grace, LEFT_BEHIND_S)

    async def _catch_up(self) -> None:
        runner = self.peer.runner
        try:
            since, seen = time.monotonic(), runner.step
            # the patience is asked again as the wait goes on: the swarm may take more steps meanwhile
            while runner.step < self.swarm_step and time.monotonic() - since < self.patience():
                await asyncio.sleep(0.1)  # the apply of the step before may still be on its way here
                if runner.step != seen:  # getting level by itself (a joiner follows its donor)
                    since, seen = time.monotonic(), runner.step
            swarm_step = self.swarm_step
            if runner.step >= swarm_step or self._rollbacks() != self._rolled:
                return  # level, or the swarm rolled back meanwhile (to a step this replica holds or restores)
            log.warning("stage %d: this replica is at step %d but the swarm is at step %d (it missed a step's reduce: "
                        "slow, or set aside); it downloads the stage's state again", runner.stage, runner.step + 1,
                        swarm_step + 1)
            self.report.write("behind", stage=runner.stage, step=runner.step, swarm_step=swarm_step)
            self.resyncs += 1
            await self.resync(swarm_step)
        finally:
            self._running = False

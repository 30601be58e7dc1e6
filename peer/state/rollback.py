"""`Rollback`: the whole swarm goes back to a step at which every stage has a snapshot, after a
stage whose every replica died was restored from an older one (`peer/state/snapshots.py`).

The leading head's side (`realign`, called by its `StepDriver` when a pause ends and after a
failed attempt): it asks every live peer its step and which snapshots of its own stage it
holds, and whether its state is a snapshot it restored. If a stage's every replica was restored
at a step S behind the swarm's step N, and every stage has a replica at S or holding its
snapshot of S,
it sends "rollback to S" to every peer; the steps S+1.. are then driven again. Since the data
of a step is a function of the step number, and every stage's state at S is what it was at S,
the run still equals the one-process run. A stage that cannot reach S keeps the swarm where
it is, and the log says which.

Every replica's side (`on_command`, the "rollback" command, from the leading head only): load
its own snapshot of S, or fetch the stage's snapshot of S from a peer that holds it (S = 0: build
the stage's initial state from the spec's seed, which every replica can); a replica
already at S just drops its partial work. What a replica holds besides its state (the reduced
sums it would forward to a follower, a follower's queue) belongs to the abandoned steps and
is dropped, and so is every snapshot it holds of a later step (those steps are taken anew).
Not restored: replica_sync "powersgd"'s error feedback (it is not in the state), so
a rolled-back powersgd swarm continues close to, not equal to, the one-process run.

A caught liar's steps (issue 20, item 2; `ordered`): when the coordinator revokes the lease of a
head that fed other data than the run's, the new lease, signed by the swarm key, orders "roll
back to snapshot step S" (`RollbackOrder`: S is the newest snapshot step that a head it still
trusts vouched for, so from before the liar led). The head that leads next carries it out
before it drives, as above, and the steps S+1.. are driven again on the run's data: the liar's
steps leave no trace. At most once per revocation: an order is numbered, and a head that
carried it out, or took its rollback command (the number rides in the command's attempt), or
is past the caught step by more than `ORDER_SLACK` steps (the order was carried out before it
joined) does not act on it again. A stage that holds no snapshot of S: the steps stay applied,
and the head logs an error that says which and why; the swarm goes on.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from peer.commit.commit import StepCommit
from peer.daemon.daemon import StageDaemon
from peer.daemon.interfaces import RollbackOrder
from peer.runner.stage import StageError
from protocol.control import Command, CommandReply

from .snapshots import NoSnapshot, SnapshotRefused, SnapshotService
from .state_transfer import Follower

log = logging.getLogger(__name__)

# a caught liar drives at most a step or two more before its lease is gone: a head further past the
# caught step than this is in the re-driven steps of an order carried out before it joined
ORDER_SLACK = 8


class Rollback:
    def __init__(self, daemon: StageDaemon, commit: StepCommit, snapshots: SnapshotService, follower: Follower,
                 check: Callable[[dict, int], Awaitable[str | None]]) -> None:
        self.daemon, self.commit, self.snapshots, self.follower, self.check = daemon, commit, snapshots, follower, check
        self.runner = daemon.runner
        self.rollbacks = 0  # rollbacks carried out here
        self.done: set[int] = set()  # the numbers of the ordered rollbacks (RollbackOrder.id) seen carried out
        # awaited by the leading head before it orders "rollback from step s to t", with (t, s): what the swarm
        # vouched for after t must go first (swarm/replicas/vouched.py), or a replica that checks its re-driven
        # state against it finds it "differs" and downloads the stage's state again, and again
        self.before: Callable[[int, int], Awaitable[None]] | None = None
        # (T, S): this replica rolled back to step T from step S, so steps T+1..S are driven again here: a record of
        # their state hashes may still be the first drive's where the coordinator did not hear of the rollback
        self.redriven: tuple[int, int] = (-1, -1)

    # ------------------------------------------------------------------ every replica
    async def on_command(self, cmd: Command) -> CommandReply:
        target, d = cmd.step, self.daemon
        before = self.runner.step
        if self.runner.step != target:
            snap = self.snapshots.store.get(self.runner.stage, target)
            try:
                if snap is not None:
                    await self.snapshots.load(snap, None)  # its own: taken here, checked when it was taken
                else:
                    await self.snapshots.restore(self.check, target)
            except (NoSnapshot, SnapshotRefused, StageError) as e:
                log.warning("stage %d: could not roll back to step %d (%s)", self.runner.stage, target, e)
                return CommandReply(cmd.step, cmd.attempt, "failed", reason=str(e)[:400])
        else:
            await d.run(self.runner.abort_step)
            d.stepped()
        if cmd.attempt:  # an ordered rollback's number (a realign sends 0)
            self.done.add(cmd.attempt)
        self.snapshots.store.drop_after(target)  # of the abandoned steps: taken anew when they are re-driven
        self.snapshots.restored = False
        self.commit.last_applied = None
        self.commit.forwarder.followers.clear()
        self.follower.queue.clear()
        self.rollbacks += 1
        again = self.redriven[1] if self.redriven[0] == target else -1  # back to T again: the undone steps grow
        self.redriven = (target, max(before, again))
        log.warning("stage %d: rolled back to step %d", self.runner.stage, target)
        return CommandReply(cmd.step, cmd.attempt, "ok")

    # ------------------------------------------------------------------ the leading head
    async def realign(self, driver) -> bool:
        """Roll the swarm back if a stage came back behind it; True if it did (the driver then goes
        on from the head's step). `driver` is this head's `StepDriver`; this head's own stage may be
        the one that came back (every head died and this one restored stage 0)."""
        if await self.ordered(driver):
            return True
        members = await driver._members()
        lists = await self.snapshots.survey(members)
        top: dict[int, int] = {}
        restored: dict[int, bool] = {}
        for p, lst in lists.items():
            top[members[p]] = max(top.get(members[p], -1), lst.step)
            restored[members[p]] = restored.get(members[p], True) and lst.restored
        step = max(top.values(), default=self.runner.step)  # the swarm's step: its most advanced stage's
        # a stage whose every replica was restored from a snapshot behind the swarm (a stage that is
        # merely slow to apply the last step, or failed to, is not restored: no reason to go back)
        behind = {s: t for s, t in top.items() if t < step and restored[s]}
        if not behind:
            return False
        target = min(behind.values())
        unable = sorted(s for s in top if not _reaches(s, target, members, lists))
        if unable:
            log.warning("stage%s %s came back at step %d, behind the swarm's %d, but stage%s %s hold%s no snapshot of "
                        "step %d: the swarm cannot roll back to it", _s(behind), _list(behind), target, step,
                        _s(unable), _list(unable), "" if len(unable) > 1 else "s", target)
            return False
        log.warning("stage%s %s came back at step %d (restored from a snapshot), behind the swarm's step %d: every "
                    "stage rolls back to step %d and steps %d-%d are driven again", _s(behind), _list(behind), target,
                    step, target, target + 1, step)
        return await self._roll_back(driver, members, target, 0, step)

    async def ordered(self, driver) -> bool:
        """Carry out the rollback the swarm key's lease orders, if this head has not seen it done; True
        if the swarm rolled back."""
        order = await self.daemon.directory.rollback_order()
        if order is None or order.id in self.done:
            return False
        self.done.add(order.id)  # once: an order that cannot be carried out now is not tried at every attempt
        members = await driver._members()
        lists = await self.snapshots.survey(members)
        # the swarm's step: its most advanced stage's (this head may have refused the liar's steps, and be behind)
        step = max([lst.step for lst in lists.values()] + [self.runner.step])
        if step <= order.to or step > order.caught + ORDER_SLACK:
            return False
        unable = [s for s in range(self.daemon.spec.n_stages) if not _reaches(s, order.to, members, lists)]
        for s in list(unable):  # a replica that joined after the snapshot holds none of its own: custodians' copies
            kept = await self.snapshots.survey({p: s for p, t in members.items() if t != s})
            if any(i.step == order.to for lst in kept.values() for i in lst.held):
                unable.remove(s)
        if unable:
            log.error("%s: the swarm cannot roll back to step %d, stage%s %s hold%s no snapshot of it. Steps %d-%d "
                      "trained on that head's data stay applied.", _why(order), order.to, _s(unable), _list(unable),
                      "" if len(unable) > 1 else "s", order.to + 1, step)
            return False
        log.warning("%s: every stage rolls back to step %d and steps %d-%d are driven again on the run's data",
                    _why(order), order.to, order.to + 1, step)
        return await self._roll_back(driver, members, order.to, order.id, step)

    async def _roll_back(self, driver, members: dict[str, int], target: int, number: int, step: int) -> bool:
        """Send "rollback to `target`" to every peer (`number`: an order's, 0 for a realign; `step`: the
        swarm's); True if this head rolled back."""
        if self.before is not None:
            await self.before(target, step)
        if driver._applying is not None:  # its retries of an abandoned step must not reach the re-driven one
            driver._applying.cancel()
        replies = await driver._broadcast(members, "rollback", target, number)
        failed = sorted({members[p] for p, r in replies.items() if r.outcome != "ok"})
        if failed:
            log.warning("some replicas of stage%s %s could not roll back: they will not take part until they rejoin",
                        _s(failed), _list(failed))
        return replies.get(self.daemon.peer_id) is not None and replies[self.daemon.peer_id].outcome == "ok"


def _reaches(stage: int, target: int, members: dict[str, int], lists: dict) -> bool:
    """Whether a replica of `stage` is at `target` or holds its own snapshot of it; every stage reaches step 0,
    whose state its replicas build from the spec's seed."""
    return target == 0 or any(members[p] == stage and (lst.step == target or any(i.step == target for i in lst.held))
                              for p, lst in lists.items())


def _why(order: RollbackOrder) -> str:
    return (f"the swarm key revoked head {order.liar[-8:]}'s lease (it fed other data than the run's, caught at "
            f"step {order.caught}) and orders its steps rolled back")


def _s(stages) -> str:
    return "s" if len(stages) > 1 else ""


def _list(stages) -> str:
    return ", ".join(map(str, sorted(stages)))

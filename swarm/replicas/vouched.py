"""`SnapshotVouch`: the coordinator's record of the snapshot hashes the swarm took (issue 19: the
leader's step record holds (step, stage, sha256)), and a peer's reader of it.

The leading head learns each stage's newest snapshot hash from its replicas' reduce replies
(`peer/step/driver.py`: only when every replica of the stage reports the same (step, sha256)), and
once every stage agrees on one step it signs the hashes into a work record for the coordinator
(`protocol/step_record.py`). The coordinator takes work records only from a head the lease
names (`swarm/basis/refit.py` checks that first) and keeps the newest `keep` steps in one record
signed by the swarm key, `VouchedSnapshots`, in the DHT. A peer that restores a stage
(`peer/state/snapshots.py`) loads only a snapshot whose (step, hash) is vouched for, when any is: a
custodian majority that holds a poisoned snapshot decides nothing.

State hashes after each step (issue 21, item 4) take the same road: the leading head sends a
work record that names the hash every stage's replicas agreed on after a step (`state_step`,
`states`: `peer/checks/state_votes.py`), the coordinator keeps the newest `KEEP_STATES` steps under the
swarm key in a second record, and a joiner loads a donor's state only if its sha256 is the one
vouched for at its step (`peer/checks/vouched_state.py`).

Both records resume from the DHT: a coordinator that restarts, or a standby that takes over with the
same swarm key, calls `SnapshotVouch.resume()` before it serves, so that its first new record still holds
the steps vouched for before (else a restore would find no vouched snapshot). Which head vouched for a
step is not in the DHT: a resumed step is never a rollback target (`before`).
"""
from __future__ import annotations

import logging

from protocol.step_record import WorkRecord
from swarm.dht import ActiveCoordinator, SwarmDHT, VouchedSnapshots

from .head_vouched import HeadVouches

log = logging.getLogger(__name__)

VOUCH_TTL_S = 86400.0
KEEP = 4  # snapshot steps vouched for at a time: every stage keeps its 2 newest, custodians too
# steps whose state hashes are vouched for at a time, one every HASH_EVERY (4) steps: 256 steps. A joiner checks the
# state it downloaded against the record of the snapshot's step once the download is done, and over a home link that
# takes minutes (2.4 GB of a `large` stage at 80 Mbit/s: 4 min, ~80 steps; tiny at 4 Mbit/s: 80 steps, measured).
# With 8 (32 steps) such a joiner's state was refused as "older than every step the swarm's records hold", every time
KEEP_STATES = 64
_TOLD: set[str] = set()  # runs whose stale records this process has logged (once)


class SnapshotVouch:
    def __init__(self, sdht: SwarmDHT, run_hash: str, n_stages: int, keep: int = KEEP,
                 ttl: float = VOUCH_TTL_S) -> None:
        self.sdht, self.run_hash, self.n_stages, self.keep = sdht, run_hash, n_stages, keep
        self.ttl = ttl  # the records' life in the DHT (`swarm coordinator --record-ttl` shortens it)
        self.vouched = VouchedSnapshots(run_hash, {})
        self.states = VouchedSnapshots(run_hash, {})  # step -> stage -> the state hash its replicas agreed on
        # called with (step, stage -> sha256) after a new snapshot step is vouched for (the coordinator's keeper)
        self.on_vouched = None
        # snapshot step -> the head whose record vouched for it (seen by this process: not in the DHT)
        self.by: dict[int, str] = {}

    def before(self, head: str, caught: int, revoked: list[str]) -> int | None:
        """The newest snapshot step vouched for, at most `caught`, by a head other than `head` and
        the `revoked` ones: from before `head` led (a rollback's target), or None.

        Only steps whose head is known count: a step taken up by `resume()` (vouched for before a restart) has
        none, and may have been vouched for by the caught head itself, whose signed hashes are what a rollback
        must not trust (every replica would load that snapshot; a head that fed other data may have named a
        hash only its accomplices hold). So it is never a target: with none from a known other head, the answer
        is None (no rollback, the caught head's steps stay applied), as before any head's record came; new
        records from other heads make targets again, and push the resumed steps out after `keep` of them."""
        return max((t for t, by in self.by.items() if t <= caught and by != head and by not in revoked
                    and t in self.vouched.steps), default=None)

    async def resume(self) -> None:
        """Take up the snapshot and state hashes this swarm key already vouches for in the DHT (a restarted
        coordinator, or a standby with the same key); call it before serving. Without it, the first new record
        would hold only the new step, and a restore would find no vouched snapshot of the steps before.
        Resumed: `vouched` (its newest `keep` steps) and `states` (the newest `KEEP_STATES`); a step already held
        here keeps its hashes. Not resumed: `by` (the DHT does not say which head vouched): see `before`.
        A DHT failure is raised, as resuming nothing would drop the earlier steps at the next record."""
        snapshots = await self.sdht.fetch_vouched(self.run_hash)
        states = await self.sdht.fetch_vouched(self.run_hash, states=True)
        if snapshots is not None:
            steps = {**snapshots.steps, **self.vouched.steps}
            self.vouched = VouchedSnapshots(self.run_hash, {t: steps[t] for t in sorted(steps)[-self.keep:]})
            self.by = {t: by for t, by in self.by.items() if t in self.vouched.steps}
        if states is not None:
            steps = {**states.steps, **self.states.steps}
            self.states = VouchedSnapshots(self.run_hash, {t: steps[t] for t in sorted(steps)[-KEEP_STATES:]})
        log.info("resumed the vouched snapshots of steps %s and the state hashes of %d steps from the DHT",
                 sorted(self.vouched.steps), len(self.states.steps))

    async def forget_after(self, step: int) -> None:
        """The swarm rolls back to `step`: what was vouched for after it (the undone steps' snapshots and
        states) is dropped, so that the same steps driven again are vouched for anew."""
        self.vouched = VouchedSnapshots(self.run_hash, {t: h for t, h in self.vouched.steps.items() if t <= step})
        self.states = VouchedSnapshots(self.run_hash, {t: h for t, h in self.states.steps.items() if t <= step})
        self.by = {t: by for t, by in self.by.items() if t <= step}
        await self.sdht.publish_vouched(self.vouched, self.ttl)
        await self.sdht.publish_vouched(self.states, self.ttl, states=True)
        log.info("forgot the snapshots and states vouched for after step %d: those steps are driven again", step)

    async def on_record(self, record: WorkRecord) -> None:
        """A verified work record from a lease holder: a rollback it is about to order, its snapshot hashes
        and its state hashes."""
        newest = max([*self.vouched.steps, *self.states.steps], default=0)
        if 0 <= record.rolled_back_to < newest:  # the head rolls the swarm back: those steps are driven again
            await self.forget_after(record.rolled_back_to)
        await self.take(record)
        await self.take_states(record)

    async def take_states(self, record: WorkRecord) -> bool:
        """Vouch for the record's state hashes if its step is newer than every one vouched for; True if stored."""
        step, hashes = record.state_step, record.states
        if step <= 0 or not hashes or step <= max(self.states.steps, default=0):
            return False
        steps = {**self.states.steps, step: dict(hashes)}
        self.states = VouchedSnapshots(self.run_hash, {t: steps[t] for t in sorted(steps)[-KEEP_STATES:]})
        stored = await self.sdht.publish_vouched(self.states, self.ttl, states=True)
        log.debug("vouched for the state hashes after step %d (stages %s)", step, sorted(hashes))
        return stored

    async def take(self, record: WorkRecord) -> bool:
        """A verified work record from a lease holder: vouch for its snapshot hashes if they are new
        and cover every stage; True if the record was stored."""
        step, hashes = record.snapshot_step, record.snapshots
        if step <= 0 or step in self.vouched.steps or sorted(hashes) != list(range(self.n_stages)):
            return False
        steps = {**self.vouched.steps, step: dict(hashes)}
        self.vouched = VouchedSnapshots(self.run_hash, {t: steps[t] for t in sorted(steps)[-self.keep:]})
        self.by = {t: by for t, by in {**self.by, step: record.leader}.items() if t in self.vouched.steps}
        stored = await self.sdht.publish_vouched(self.vouched, self.ttl)
        log.info("vouched for the snapshots at step %d (from %s's record)%s", step, record.leader[-8:],
                 "" if stored else "; the DHT did not store it, the next record retries")
        if self.on_vouched is not None:
            self.on_vouched(step, dict(hashes), record.leader)
        return stored

    async def republish(self) -> None:
        if self.vouched.steps:
            await self.sdht.publish_vouched(self.vouched, self.ttl)
        if self.states.steps:
            await self.sdht.publish_vouched(self.states, self.ttl, states=True)


async def _stale(seat: ActiveCoordinator | None) -> bool:
    """Whether the vouched records are old and nothing newer can come: no coordinator holds the seat (`seat`: the
    claims, as `BasisSync.coordinator` reads them). They are then not read: a joiner would refuse every donor the
    swarm moved past the records' newest step (and, finding none, restore a snapshot and roll the swarm back), and
    a restore would wait for a snapshot the records name, which custodians no longer keep (they keep the two
    newest). The hashes the lease's heads signed count instead (`head_vouched.py`). docs/security.md, "Without any
    coordinator"."""
    if seat is None or not await seat.lapsed():
        return False
    if seat.run_hash not in _TOLD:
        _TOLD.add(seat.run_hash)
        log.warning("no coordinator holds the seat: the vouched snapshot and state hashes are old and no newer ones "
                    "come, so joiners and restores check against the hashes the lease's heads signed until a "
                    "coordinator is back")
    return True


async def coordinator_vouches(seat: ActiveCoordinator | None) -> bool:
    """Whether the swarm key's records are the ones to check against (a coordinator holds the seat, or this run's
    coordinator claims none): then a state may be taken unchecked before any record is made, as before vouching.
    False while no coordinator holds the seat: the heads' records are the only word, and none yet means wait."""
    return not await _stale(seat)


async def vouched_hashes(sdht: SwarmDHT, run_hash: str, stage: int, seat: ActiveCoordinator | None = None,
                         heads: HeadVouches | None = None) -> dict[int, str]:
    """step -> the sha256 the swarm key vouches for, of `stage`'s snapshot at that step ({}: none, or unreadable);
    stale (`_stale`): the ones the lease's `heads` signed ({} if none given)."""
    if await _stale(seat):
        return await heads.hashes(stage, "snapshot") if heads is not None else {}
    try:
        vouched = await sdht.fetch_vouched(run_hash)
    except Exception as e:  # no coordinator key, or a DHT hiccup: the restore falls back to the custodians' word
        log.debug("could not read the vouched snapshots: %s", e)
        return {}
    if vouched is None:
        return {}
    return {t: h[stage] for t, h in vouched.steps.items() if stage in h}


async def vouched_states(sdht: SwarmDHT, run_hash: str, stage: int, seat: ActiveCoordinator | None = None,
                         heads: HeadVouches | None = None) -> dict[int, str]:
    """steps -> the sha256 the swarm key vouches for, of `stage`'s state after that many steps ({}: none, or
    unreadable); stale (`_stale`): the ones the lease's `heads` signed ({} if none given)."""
    if await _stale(seat):
        return await heads.hashes(stage) if heads is not None else {}
    try:
        vouched = await sdht.fetch_vouched(run_hash, states=True)
    except Exception as e:  # no coordinator key, or a DHT hiccup: nothing to check against
        log.debug("could not read the vouched state hashes: %s", e)
        return {}
    if vouched is None:
        return {}
    return {t: h[stage] for t, h in vouched.steps.items() if stage in h}

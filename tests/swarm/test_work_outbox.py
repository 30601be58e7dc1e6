"""The leading head's work records while no coordinator is reached (swarm/replicas/work_outbox.py, issue 56): the
snapshot and state records are kept and go, in order and signed, to the next coordinator before the next record,
which then vouches for the steps trained while the seat was empty; a rollback drops the kept records of the steps
it undid and is kept itself; another head driving meanwhile drops what was kept; the kept records are bounded;
and the coordinator that takes the seat knows the lease's heads before it serves the first record."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from protocol.spec import preset
from protocol.step_record import WorkRecord
from swarm.dht import LeaderLease, VouchedSnapshots
from swarm.replicas.leases import LeaseKeeper
from swarm.replicas.vouched import KEEP_STATES, SnapshotVouch
from swarm.replicas.work_outbox import KEPT_SNAPSHOTS
from swarm.replicas.work_records import WorkRecords
from swarm.trust.identity import Identity
from swarm.trust.signed_records import signed_by_leader

SPEC = preset("tiny", stages=2)


def sha(i: int) -> str:
    return f"{i:064x}"


class Coordinator:
    """`BasisSync.send_work` as the head sees it: away (no coordinator reached) or up, taking every record."""

    def __init__(self) -> None:
        self.up, self.got, self.tries = False, [], 0

    async def send_work(self, body: bytes) -> bool:
        self.tries += 1
        if not self.up:
            return False
        record = WorkRecord.decode(body, SPEC.run_hash, SPEC.n_stages)
        assert signed_by_leader(record)
        self.got.append(record)
        return True


class Stored:
    """The DHT as `SnapshotVouch` writes to it."""

    async def publish_vouched(self, vouched: VouchedSnapshots, ttl: float, states: bool = False) -> bool:
        return True


def head(coordinator: Coordinator) -> tuple[WorkRecords, list[asyncio.Task]]:
    identity, tasks = Identity.generate(), []
    held = SimpleNamespace(keep_work=lambda *a: None, forget_work_after=lambda *a: None)  # head_vouched.py's
    ctx = SimpleNamespace(sdht=SimpleNamespace(identity=identity, held=held), peer_id=identity.peer_id,
                          report=SimpleNamespace(write=lambda *a, **k: None))
    return WorkRecords(SPEC, ctx, coordinator, lambda coro: tasks.append(asyncio.ensure_future(coro))), tasks


async def settled(tasks: list[asyncio.Task]) -> None:
    while not all(t.done() for t in tasks):
        await asyncio.gather(*tasks)


def drive(records: WorkRecords, first: int, last: int, state: int = 0) -> None:
    """Steps first..last as leader: a state record every 4th step (hash `state` + step)."""
    for steps in range(first, last + 1):
        records.after_commit(steps, {}, None)
        if steps % 4 == 0:
            records.vouch_states(steps, {0: sha(state + steps), 1: sha(state + steps + 1)})


def seen(got: list[WorkRecord]) -> list[tuple[str, int]]:
    return [("rollback", r.rolled_back_to) if r.rolled_back_to >= 0 else
            ("state", r.state_step) if r.state_step else ("snapshot", r.snapshot_step) for r in got]


async def test_records_that_reached_no_coordinator_go_in_order_to_the_next_one_which_vouches_for_them():
    coordinator = Coordinator()
    records, tasks = head(coordinator)
    coordinator.up = True
    drive(records, 1, 8)
    await settled(tasks)
    standby = SnapshotVouch(Stored(), SPEC.run_hash, SPEC.n_stages)  # the one that takes the seat: it resumed these
    for record in coordinator.got:
        await standby.on_record(record)
    coordinator.up, coordinator.got = False, []

    drive(records, 9, 12)  # the seat is empty: trained, and nobody vouches
    records.after_commit(13, {0: ["w"]}, (12, {0: sha(90), 1: sha(91)}))  # every stage snapshotted at 12
    drive(records, 14, 16)
    await settled(tasks)
    assert coordinator.got == [] and len(records.outbox.unsent) == 3

    coordinator.up = True  # a standby holds the seat now
    drive(records, 17, 20)
    await settled(tasks)
    assert seen(coordinator.got) == [("state", 12), ("snapshot", 12), ("state", 16), ("state", 20)]
    assert coordinator.got[1].workers == {}  # a kept record names no re-fit workers: that re-fit is gone by
    assert records.outbox.unsent == []
    for record in coordinator.got:
        await standby.on_record(record)
    assert sorted(standby.states.steps) == [4, 8, 12, 16, 20]  # the steps trained without a coordinator, vouched
    assert standby.states.steps[16] == {0: sha(16), 1: sha(17)} and 12 in standby.vouched.steps


async def test_a_rollback_drops_the_kept_records_of_the_undone_steps_and_is_kept_itself():
    coordinator = Coordinator()
    records, tasks = head(coordinator)
    coordinator.up = True
    drive(records, 1, 12)
    await settled(tasks)
    standby = SnapshotVouch(Stored(), SPEC.run_hash, SPEC.n_stages)
    for record in coordinator.got:
        await standby.on_record(record)
    coordinator.up, coordinator.got = False, []

    drive(records, 13, 20)  # the seat empty: 16 and 20 kept
    await records.before_rollback(8, 20)  # a liar caught: 9..20 are undone, 12 of them vouched before the outage
    drive(records, 9, 16, state=1000)  # driven again: other bits
    await settled(tasks)
    coordinator.up = True
    drive(records, 17, 17)
    records.vouch_states(17, {0: sha(5), 1: sha(6)})
    await settled(tasks)
    assert seen(coordinator.got) == [("rollback", 8), ("state", 12), ("state", 16), ("state", 17)]
    assert coordinator.got[1].states[0] == sha(1012)  # the re-driven step's hash, never the undone one
    for record in coordinator.got:
        await standby.on_record(record)
    assert sorted(standby.states.steps) == [4, 8, 12, 16, 17]
    assert standby.states.steps[12][0] == sha(1012)  # without the rollback record it would keep the undone 12


async def test_a_later_rollback_to_a_lower_step_stands_for_an_earlier_kept_one():
    coordinator = Coordinator()
    records, tasks = head(coordinator)
    drive(records, 1, 12)
    await records.before_rollback(8, 12)
    drive(records, 9, 12, state=100)
    await records.before_rollback(4, 12)
    await settled(tasks)
    assert seen(records.outbox.unsent) == [("state", 4), ("rollback", 4)]
    await records.before_rollback(6, 4)  # no lower than the kept one: it says nothing new
    assert seen(records.outbox.unsent) == [("state", 4), ("rollback", 4)]


async def test_what_was_kept_is_dropped_once_another_head_drove_steps_meanwhile():
    coordinator = Coordinator()
    records, tasks = head(coordinator)
    drive(records, 1, 8)
    await settled(tasks)
    assert len(records.outbox.unsent) == 2
    drive(records, 13, 16)  # steps 9..12 were driven by another head, which may have rolled 4 and 8 back
    await settled(tasks)
    coordinator.up = True
    drive(records, 17, 20)
    await settled(tasks)
    assert seen(coordinator.got) == [("state", 16), ("state", 20)]


async def test_the_kept_records_are_bounded_to_what_a_joiner_or_a_restore_can_use():
    coordinator = Coordinator()
    records, tasks = head(coordinator)
    for steps in range(1, 4 * (KEEP_STATES + 10) + 1):
        snapshot = (steps - 1, {0: sha(steps), 1: sha(steps)}) if steps % 40 == 1 and steps > 1 else None
        records.after_commit(steps, {}, snapshot)
        if steps % 4 == 0:
            records.vouch_states(steps, {0: sha(steps), 1: sha(steps)})
        await settled(tasks)
    kept = records.outbox.unsent
    states = [r.state_step for r in kept if r.state_step]
    snapshots = [r.snapshot_step for r in kept if r.snapshot_step]
    assert states == list(range(4 * 11, 4 * (KEEP_STATES + 10) + 1, 4)) and len(states) == KEEP_STATES
    assert snapshots == [240, 280] and len(snapshots) == KEPT_SNAPSHOTS
    assert [r.step for r in kept] == sorted(r.step for r in kept)  # still in the order made


async def test_a_record_the_coordinator_answered_is_not_kept_and_one_send_is_tried_per_record_while_away():
    coordinator = Coordinator()
    records, tasks = head(coordinator)
    for first in (1, 5, 9):
        drive(records, first, first + 3)
        await settled(tasks)
    assert coordinator.tries == 3  # one try per record made: the kept ones wait behind the first that failed
    coordinator.up = True
    drive(records, 13, 16)
    await settled(tasks)
    assert seen(coordinator.got) == [("state", 4), ("state", 8), ("state", 12), ("state", 16)]
    drive(records, 17, 20)
    await settled(tasks)
    assert seen(coordinator.got)[-1] == ("state", 20) and len(coordinator.got) == 5


async def test_a_coordinator_names_the_stored_leases_heads_before_it_serves_the_first_record():
    """A standby serves the moment it holds the seat, and the records a leader kept come at once: its lease keeper
    reads the stored lease first (`LeaseKeeper.load`, awaited in `CoordinatorDuties.start`), or it would refuse
    them as from a head no lease names."""
    reads = []

    async def fetch_lease(run_hash: str) -> LeaderLease:
        reads.append(run_hash)
        return LeaderLease(run_hash, 3, ["head-a", "head-b"])
    keeper = LeaseKeeper(SimpleNamespace(fetch_lease=fetch_lease), SPEC.run_hash)
    await keeper.load()
    await keeper.load()  # run() loads too: once is enough
    assert keeper.lease is not None and keeper.lease.order == ["head-a", "head-b"] and reads == [SPEC.run_hash]

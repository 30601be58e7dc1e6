"""Snapshot hashes vouched for by the swarm key (swarm/replicas/vouched.py): the coordinator keeps
the newest few steps at which a lease holder's work record had every stage's hash, and a peer
reads them back over a real DHT, only under the swarm key."""
from __future__ import annotations

import pytest

from protocol.step_record import WorkRecord
from protocol.wire import WireError
from swarm.dht import RecordError, VouchedSnapshots
from swarm.replicas.vouched import KEEP_STATES, SnapshotVouch, vouched_hashes, vouched_states
from tests.swarm.test_dht import eventually, swarm  # noqa: F401  (the fixture: two real DHT nodes)
from tests.swarm.test_leases import swarm_key_views

RUN = "0123456789abcdef"


def sha(i: int) -> str:
    return f"{i:064x}"


class Stored:
    def __init__(self) -> None:
        self.records: list[VouchedSnapshots] = []
        self.states: list[VouchedSnapshots] = []

    async def publish_vouched(self, vouched: VouchedSnapshots, ttl: float, states: bool = False) -> bool:
        (self.states if states else self.records).append(VouchedSnapshots.from_record(vouched.to_record()))
        return True


def record(step: int, hashes: dict[int, str]) -> WorkRecord:
    return WorkRecord(RUN, step + 1, "leader", {}, snapshot_step=step, snapshots=hashes)


async def test_the_coordinator_vouches_only_for_complete_new_steps_and_keeps_the_newest_few():
    dht = Stored()
    vouch = SnapshotVouch(dht, RUN, n_stages=3, keep=2)
    assert not await vouch.take(record(50, {0: sha(1), 1: sha(2)}))  # stage 2 missing: no vouch
    assert await vouch.take(record(50, {0: sha(1), 1: sha(2), 2: sha(3)}))
    assert not await vouch.take(record(50, {0: sha(9), 1: sha(9), 2: sha(9)}))  # a step is vouched for once
    assert await vouch.take(record(100, {0: sha(4), 1: sha(5), 2: sha(6)}))
    assert await vouch.take(record(150, {0: sha(7), 1: sha(8), 2: sha(9)}))
    assert sorted(dht.records[-1].steps) == [100, 150] and dht.records[-1].steps[150][1] == sha(8)
    with pytest.raises(RecordError):
        VouchedSnapshots(RUN, {10: {0: "not a hash"}})


def states(step: int, hashes: dict[int, str]) -> WorkRecord:
    return WorkRecord(RUN, step, "leader", {}, state_step=step, states=hashes)


async def test_the_coordinator_vouches_for_each_newer_steps_state_hashes_and_keeps_the_newest_few():
    dht = Stored()
    vouch = SnapshotVouch(dht, RUN, n_stages=3)
    assert await vouch.take_states(states(4, {0: sha(1), 2: sha(2)}))  # stage 1 tied: the others still vouched
    assert not await vouch.take_states(states(4, {0: sha(9)}))  # a step is vouched for once
    assert not await vouch.take_states(states(0, {0: sha(9)})) and not await vouch.take_states(states(8, {}))
    for step in range(8, 8 + 4 * KEEP_STATES, 4):
        assert await vouch.take_states(states(step, {0: sha(step), 1: sha(step + 1), 2: sha(step + 2)}))
    assert not await vouch.take_states(states(12, {0: sha(9)}))  # older than the newest: late, not taken
    newest = dht.states[-1].steps
    assert len(newest) == KEEP_STATES and max(newest) == 4 + 4 * KEEP_STATES and newest[36][1] == sha(37)
    assert not dht.records  # no snapshot was vouched for by records of states only
    later = 8 + 4 * KEEP_STATES  # newer than every step vouched for above
    await vouch.on_record(WorkRecord(RUN, later + 3, "leader", {0: ["a"]}, snapshot_step=later + 2,
                                     snapshots={0: sha(1), 1: sha(2), 2: sha(3)}, state_step=later,
                                     states={0: sha(4)}))
    assert dht.records[-1].steps[later + 2][2] == sha(3) and dht.states[-1].steps[later] == {0: sha(4)}  # one record


async def test_a_head_about_to_roll_back_makes_the_coordinator_forget_the_undone_steps_and_vouch_them_anew():
    """Issue 56, item 4: re-driven steps need not be the same bits (another split of the microbatches
    among heads), so the hashes of the first drive must go before any replica checks against them."""
    dht = Stored()
    vouch = SnapshotVouch(dht, RUN, n_stages=2)
    for step in range(1, 13):
        assert await vouch.take_states(states(step, {0: sha(step), 1: sha(100 + step)}))
    assert await vouch.take(record(6, {0: sha(6), 1: sha(106)}))
    assert not await vouch.take_states(states(4, {0: sha(404), 1: sha(504)}))  # step 4 again, no rollback said
    rollback = WorkRecord(RUN, 12, "leader", {}, rolled_back_to=3)
    assert WorkRecord.decode(rollback.encode(), RUN, 2).rolled_back_to == 3
    assert WorkRecord.decode(states(12, {0: sha(1)}).encode(), RUN, 2).rolled_back_to == -1
    assert rollback.signing_bytes() != WorkRecord(RUN, 12, "leader", {}, rolled_back_to=0).signing_bytes()
    await vouch.on_record(rollback)
    assert sorted(dht.states[-1].steps) == [1, 2, 3] and dht.records[-1].steps == {}
    await vouch.on_record(states(4, {0: sha(404), 1: sha(504)}))  # step 4 driven again: other bits, vouched
    assert dht.states[-1].steps[4] == {0: sha(404), 1: sha(504)}
    published = len(dht.states)
    await vouch.on_record(WorkRecord(RUN, 12, "leader", {}, rolled_back_to=5))  # nothing vouched after 5: no-op
    assert len(dht.states) == published
    with pytest.raises(WireError):  # a rollback goes back: never to the record's own step or past it
        WorkRecord.decode(WorkRecord(RUN, 12, "leader", {}, rolled_back_to=12).encode(), RUN, 2)


@pytest.mark.e2e
async def test_a_peer_reads_the_vouched_hashes_of_its_stage_under_the_swarm_key_only(swarm):  # noqa: F811
    coordinator, forger, reader = swarm_key_views(swarm)
    assert await forger.publish_vouched(VouchedSnapshots(RUN, {900: {1: sha(66)}}), 60)
    assert await vouched_hashes(reader, RUN, 1) == {}
    assert await SnapshotVouch(coordinator, RUN, n_stages=2).take(record(50, {0: sha(1), 1: sha(2)}))
    found = await eventually(lambda: vouched_hashes(reader, RUN, 1))  # the record travels between the nodes
    assert found == {50: sha(2)}
    # the state hashes after each step: a record of their own, under the swarm key only
    assert await forger.publish_vouched(VouchedSnapshots(RUN, {900: {1: sha(66)}}), 60, states=True)
    assert await vouched_states(reader, RUN, 1) == {}
    assert await SnapshotVouch(coordinator, RUN, n_stages=2).take_states(states(8, {0: sha(3), 1: sha(4)}))
    assert await eventually(lambda: vouched_states(reader, RUN, 1)) == {8: sha(4)}

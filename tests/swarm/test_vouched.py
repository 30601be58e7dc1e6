"""Snapshot hashes vouched for by the swarm key (swarm/replicas/vouched.py): the coordinator keeps
the newest few steps at which a lease holder's work record had every stage's hash, and a peer
reads them back over a real DHT, only under the swarm key."""
from __future__ import annotations

import pytest

from protocol.step_record import WorkRecord
from swarm.dht import RecordError, VouchedSnapshots
from swarm.replicas.vouched import SnapshotVouch, vouched_hashes
from tests.swarm.test_dht import eventually, swarm  # noqa: F401  (the fixture: two real DHT nodes)
from tests.swarm.test_leases import swarm_key_views

RUN = "0123456789abcdef"


def sha(i: int) -> str:
    return f"{i:064x}"


class Stored:
    def __init__(self) -> None:
        self.records: list[VouchedSnapshots] = []

    async def publish_vouched(self, vouched: VouchedSnapshots, ttl: float) -> bool:
        self.records.append(VouchedSnapshots.from_record(vouched.to_record()))
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


@pytest.mark.e2e
async def test_a_peer_reads_the_vouched_hashes_of_its_stage_under_the_swarm_key_only(swarm):  # noqa: F811
    coordinator, forger, reader = swarm_key_views(swarm)
    assert await forger.publish_vouched(VouchedSnapshots(RUN, {900: {1: sha(66)}}), 60)
    assert await vouched_hashes(reader, RUN, 1) == {}
    assert await SnapshotVouch(coordinator, RUN, n_stages=2).take(record(50, {0: sha(1), 1: sha(2)}))
    found = await eventually(lambda: vouched_hashes(reader, RUN, 1))  # the record travels between the nodes
    assert found == {50: sha(2)}

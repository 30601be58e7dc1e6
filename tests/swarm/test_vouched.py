"""Snapshot hashes vouched for by the swarm key (swarm/replicas/vouched.py): the coordinator keeps
the newest few steps at which a lease holder's work record had every stage's hash, and a peer
reads them back over a real DHT, only under the swarm key."""
from __future__ import annotations

import asyncio

import pytest

from protocol.step_record import WorkRecord
from swarm.dht import RecordError, SwarmDHT, VouchedSnapshots
from swarm.replicas.vouched import SnapshotVouch, vouched_hashes
from swarm.trust.admission import AdmissionPolicy
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.swarm.test_dht import swarm  # noqa: F401  (the fixture: two real DHT nodes)

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
    key, stranger = SigningKey.generate(), SigningKey.generate()
    policy = AdmissionPolicy(False, key.public_bytes())
    coordinator = SwarmDHT(swarm.first.dht, Identity.of_key(key), swarm_key=key, policy=policy)
    forger = SwarmDHT(swarm.first.dht, Identity.of_key(stranger), swarm_key=stranger)
    reader = SwarmDHT(swarm.second.dht, policy=policy)
    assert await forger.publish_vouched(VouchedSnapshots(RUN, {900: {1: sha(66)}}), 60)
    assert await vouched_hashes(reader, RUN, 1) == {}
    assert await SnapshotVouch(coordinator, RUN, n_stages=2).take(record(50, {0: sha(1), 1: sha(2)}))
    deadline = asyncio.get_running_loop().time() + 15
    while not (found := await vouched_hashes(reader, RUN, 1)) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.2)  # poll: the record travels between the nodes
    assert found == {50: sha(2)}

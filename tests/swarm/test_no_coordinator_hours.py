"""Two hours of record time without any coordinator, on a clock the test moves (issue 56, item 2): the run spec
(60 s in the DHT), the basis chain (100 min) and the leader lease (1 h) are all gone from the DHT, yet a newcomer
gets each of them from a peer that read them while the coordinator was up, checked against the swarm key, and
re-serves them in turn; every record it needs stays with the peers however long no coordinator is up. A coordinator
that comes back after that long resumes the basis chain and the lease from the peers, not from nothing."""
from __future__ import annotations

import pytest
import torch

from protocol.basis_update import BasisUpdate, encode_update
from protocol.spec import preset
from swarm.basis.refit import BasisRefitter
from swarm.basis.sync import BasisSync
from swarm.coordinator.options import sealed_spec
from swarm.dht import LeaderLease, SwarmDHT, lease_key
from swarm.dht import store as store_module
from swarm.dht.record_share import PeerRecords, RecordShare
from swarm.node import fetch_spec
from swarm.replicas.leases import LEASE_TTL_S
from swarm.trust.admission import AdmissionPolicy
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.swarm.memory_dht import Clock, MemoryDHT

HOURS = 2 * 3600.0


def _chain(spec, key: SigningKey, n: int) -> list[BasisUpdate]:
    out = []
    for version in range(1, n + 1):
        U, _ = torch.linalg.qr(torch.randn(spec.d_model, spec.rank, generator=torch.Generator().manual_seed(version)))
        update = BasisUpdate(spec.run_hash, version, 5 * version + 2, U.contiguous())
        update.signature = key.sign(update.signing_bytes())
        out.append(update)
    return out


def _asking(peer: SwarmDHT, basis_bytes: int = 0) -> PeerRecords:
    """A newcomer's asker whose one candidate is `peer` (its share called in process, as the transport would)."""
    share = RecordShare(peer.held)

    async def request(_peer: str, _kind: str, body: bytes, _timeout: float) -> bytes:
        return await share.on_request(body, "newcomer")

    async def candidates() -> list[str]:
        return ["peer"]
    return PeerRecords(request, candidates, basis_bytes=basis_bytes, every_s=0.0)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(store_module, "get_dht_time", clock)  # every expiry SwarmDHT writes and reads
    return clock


async def test_two_hours_after_the_last_coordinator_a_newcomer_gets_spec_chain_and_lease_from_a_peer(clock):
    dht, key = MemoryDHT(clock), SigningKey.generate()
    spec = sealed_spec(preset("tiny", stages=2, codec="subspace", basis_interval=5), key, "12D3KooWCoordinator")
    coordinator = SwarmDHT(dht, Identity.generate(), swarm_key=key)
    await coordinator.publish_run_spec(spec.to_json(), key, 60.0)  # the coordinator's default lifetimes
    chain = _chain(spec, key, 3)
    for update in chain:
        await coordinator.publish_basis(spec.run_hash, update.version, encode_update(update), 6000.0)
    await coordinator.publish_lease(LeaderLease(spec.run_hash, 7, ["head-a", "head-b"]), LEASE_TTL_S)

    peer = SwarmDHT(dht, Identity.generate())  # joined while the coordinator was up
    assert (await fetch_spec(peer, key.public_bytes().hex(), 5.0)).run_hash == spec.run_hash
    await peer.adopt(spec)
    assert [u.version for u in await BasisSync(spec, peer, None)._verified_updates()] == [1, 2, 3]
    assert (await peer.fetch_lease(spec.run_hash)).term == 7

    clock.advance(HOURS)  # the coordinator is gone: two hours of record time pass
    assert await peer.fetch_run_spec() is None
    assert await peer.fetch_bases(spec.run_hash) == {}
    assert await dht.get(lease_key(spec.run_hash)) is None  # nothing of the lease is left in the DHT
    # the peer still holds what it read, and still follows it
    assert (await peer.fetch_lease(spec.run_hash)).order == ["head-a", "head-b"]

    newcomer = SwarmDHT(dht, Identity.generate())
    got = await fetch_spec(newcomer, key.fingerprint(), 5.0, _asking(peer))  # pinned by its fingerprint
    assert got.to_json() == spec.to_json()
    await newcomer.adopt(got)
    newcomer.record_peers = _asking(peer, spec.d_model * spec.rank * 4 + 4096)
    updates = await BasisSync(got, newcomer, None)._verified_updates()
    assert [u.version for u in updates] == [1, 2, 3]
    assert all(torch.equal(a.U, b.U) for a, b in zip(updates, chain))
    lease = await newcomer.fetch_lease(spec.run_hash)
    assert (lease.term, lease.order) == (7, ["head-a", "head-b"])

    clock.advance(HOURS)  # and the newcomer serves the next one, as long again after
    third = SwarmDHT(dht, Identity.generate())
    assert (await fetch_spec(third, None, 5.0, _asking(newcomer))).run_hash == spec.run_hash
    await third.adopt(spec)
    third.record_peers = _asking(newcomer, spec.d_model * spec.rank * 4 + 4096)
    assert [u.version for u in await BasisSync(spec, third, None)._verified_updates()] == [1, 2, 3]
    assert (await third.fetch_lease(spec.run_hash)).term == 7


async def test_a_coordinator_back_after_two_hours_resumes_the_chain_and_the_lease_from_the_peers(clock):
    dht, key = MemoryDHT(clock), SigningKey.generate()
    spec = sealed_spec(preset("tiny", stages=2, codec="subspace", basis_interval=5), key, "12D3KooWCoordinator")
    first = SwarmDHT(dht, Identity.generate(), swarm_key=key)
    await first.publish_run_spec(spec.to_json(), key, 60.0)
    for update in _chain(spec, key, 2):
        await first.publish_basis(spec.run_hash, update.version, encode_update(update), 6000.0)
    await first.publish_lease(LeaderLease(spec.run_hash, 7, ["head-a"], revoked=["liar"]), LEASE_TTL_S)
    peer = SwarmDHT(dht, Identity.generate())
    await fetch_spec(peer, None, 5.0)
    await peer.adopt(spec)
    await BasisSync(spec, peer, None)._verified_updates()
    await peer.fetch_lease(spec.run_hash)

    clock.advance(HOURS)
    back = SwarmDHT(dht, Identity.generate(), swarm_key=key, policy=AdmissionPolicy(False, key.public_bytes(), ""))
    refitter = BasisRefitter(spec, key, back, None, 6000.0)
    assert await refitter.resume() == 0  # the DHT alone: the chain is gone, re-fits would never resume
    assert await refitter.resume(_asking(peer, spec.d_model * spec.rank * 4 + 4096)) == 2
    assert sorted(refitter.bases) == [0, 1, 2]
    back.record_peers = _asking(peer)  # as `share_records` sets it: the lease keeper resumes the order
    lease = await back.fetch_lease(spec.run_hash)
    assert (lease.term, lease.order, lease.revoked) == (7, ["head-a"], ["liar"])

"""With no coordinator in the seat, the vouched snapshot and state hashes are read as none (swarm/replicas/
vouched.py `_stale`): nobody vouches for a newer step, so a joiner would otherwise refuse every donor the swarm moved
past the records' newest step (then restore a snapshot and roll the swarm back), and a restore would wait for a
snapshot the custodians no longer keep. While a coordinator's claim is live, or where no coordinator ever claimed
the seat (an older version), the records count as before."""
from __future__ import annotations

from protocol.spec import preset
from swarm.coordinator.options import sealed_spec
from swarm.dht import ActiveCoordinator, CoordinatorClaim, SwarmDHT, VouchedSnapshots
from swarm.dht import store as store_module
from swarm.dht import swarm_records as swarm_records_module
from swarm.replicas.vouched import vouched_hashes, vouched_states
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.swarm.memory_dht import Clock, MemoryDHT


async def test_vouched_hashes_count_while_a_coordinator_holds_the_seat_and_read_as_none_once_none_does(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(store_module, "get_dht_time", clock)
    monkeypatch.setattr(swarm_records_module, "get_dht_time", clock)
    monkeypatch.setattr("swarm.dht.seat_reader.get_dht_time", clock)
    key = SigningKey.generate()
    spec = sealed_spec(preset("tiny", stages=2), key)
    dht = MemoryDHT(clock)
    coordinator, peer = SwarmDHT(dht, swarm_key=key), SwarmDHT(dht, Identity.generate())
    await peer.adopt(spec)
    seat = ActiveCoordinator(peer, spec.run_hash, refresh_s=0.0)
    hashes = {8: {0: "a" * 64, 1: "b" * 64}}
    await coordinator.publish_vouched(VouchedSnapshots(spec.run_hash, hashes), 86400.0)
    await coordinator.publish_vouched(VouchedSnapshots(spec.run_hash, hashes), 86400.0, states=True)

    # no claim ever read (a coordinator of an older version): the records count
    assert await vouched_states(peer, spec.run_hash, 1, seat) == {8: "b" * 64}
    claim = CoordinatorClaim(spec.run_hash, 1, "12D3KooWCoordinator", clock(), clock() + 12.0)
    await coordinator.publish_claim(claim, 86400.0)
    assert await vouched_states(peer, spec.run_hash, 1, seat) == {8: "b" * 64}  # a live claim: they count
    assert await vouched_hashes(peer, spec.run_hash, 0, seat) == {8: "a" * 64}

    clock.advance(13.0)  # the claim lapsed: no coordinator holds the seat, nobody vouches for a newer step
    assert await vouched_states(peer, spec.run_hash, 1, seat) == {}
    assert await vouched_hashes(peer, spec.run_hash, 0, seat) == {}
    assert await vouched_states(peer, spec.run_hash, 1) == {8: "b" * 64}  # a reader that reads no seat: as before

    await coordinator.publish_claim(CoordinatorClaim(spec.run_hash, 2, "12D3KooWStandby", clock(), clock() + 12.0),
                                    86400.0)  # a coordinator is back in the seat
    assert await vouched_states(peer, spec.run_hash, 1, seat) == {8: "b" * 64}

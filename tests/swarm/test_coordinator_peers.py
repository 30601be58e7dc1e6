"""Who a peer asks for what any coordinator holds (issue 56): the seat's holder, then the other coordinators with
live claims, with none live the newest term's, and the spec's `coordinator_peer` only where no claim was ever read
(`ActiveCoordinator.peer_ids`, swarm/dht/seat_reader.py). Used for the snapshots a coordinator with
--checkpoint-dir keeps (swarm/replicas/replica.py), the tokenizer (swarm/data/tokenizer_fetch.py) and the dial-back
(swarm/net/reachability.py): a standby that took the seat is asked, not only the coordinator the spec names."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from protocol.spec import preset
from swarm.coordinator.options import sealed_spec
from swarm.data.tokenizer_fetch import candidates
from swarm.dht import ActiveCoordinator, CoordinatorClaim, SwarmDHT
from swarm.dht import store as store_module
from swarm.dht import swarm_records as swarm_records_module
from swarm.net.reachability import pick_helpers
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.swarm.memory_dht import Clock, MemoryDHT

SPEC_PEER, STANDBY, THIRD = "12D3KooWTheSpecsCoordinator", "12D3KooWStandby", "12D3KooWThird"


@pytest.fixture
def run(monkeypatch):
    """A peer's SwarmDHT of a run whose spec names SPEC_PEER, the swarm key's (to write claims), and the clock."""
    clock = Clock()
    for module in (store_module, swarm_records_module):
        monkeypatch.setattr(module, "get_dht_time", clock)
    monkeypatch.setattr("swarm.dht.seat_reader.get_dht_time", clock)
    key = SigningKey.generate()
    spec = sealed_spec(preset("tiny", stages=2), key)
    spec.extra["coordinator_peer"] = SPEC_PEER
    dht = MemoryDHT(clock)
    coordinator, peer = SwarmDHT(dht, swarm_key=key), SwarmDHT(dht, Identity.generate())
    return SimpleNamespace(spec=spec, clock=clock, key=coordinator, peer=peer)


async def claim(run, peer_id: str, term: int, live_s: float = 12.0) -> None:
    await run.key.publish_claim(CoordinatorClaim(run.spec.run_hash, term, peer_id, run.clock(),
                                                 run.clock() + live_s), 86400.0)


async def test_the_coordinators_asked_are_the_holder_then_live_claims_then_the_newest_then_the_spec(run):
    await run.peer.adopt(run.spec)
    seat = ActiveCoordinator(run.peer, run.spec.run_hash, SPEC_PEER, refresh_s=0.0)
    assert await seat.peer_ids() == [SPEC_PEER]  # no claim ever read: a coordinator of an older version
    await claim(run, SPEC_PEER, 1, live_s=5.0)
    run.clock.advance(6.0)  # the spec's coordinator died; a standby took the seat
    await claim(run, STANDBY, 2)
    assert await seat.peer_ids() == [STANDBY]  # the dead one's claim lapsed: not asked
    await claim(run, THIRD, 3)  # claimed while the standby was paused: both live for a moment
    assert (await seat.refresh()).peer_id == THIRD and await seat.peer_ids() == [THIRD, STANDBY]  # holder first
    run.clock.advance(13.0)  # every coordinator down: the newest term's is the best guess, not the spec's
    assert await seat.peer_ids() == [THIRD]
    assert await ActiveCoordinator(_NoClaims(), "run", "").peer_ids() == []  # no coordinator named at all


class _NoClaims:
    async def fetch_claims(self, run_hash: str) -> list:
        return []


async def test_the_tokenizer_is_asked_of_the_standby_in_the_seat_first(run):
    await run.peer.adopt(run.spec)
    assert await candidates(run.spec, run.peer) == [SPEC_PEER]  # no claim: the spec's coordinator, as before
    await claim(run, SPEC_PEER, 1, live_s=5.0)
    run.clock.advance(6.0)
    await claim(run, STANDBY, 2)
    assert await candidates(run.spec, run.peer) == [STANDBY]
    assert await candidates(run.spec, run.peer, own_id=STANDBY) == []  # never itself


async def test_the_tokenizer_candidates_fall_back_to_the_spec_when_the_claims_cannot_be_read(run):
    # not adopted: no key to trust claims from (RecordError), so no claim is read
    assert await candidates(run.spec, run.peer) == [SPEC_PEER]


class Announced:
    """What a dial-back reads of the DHT: every stage's announced peers."""

    async def all_stage_peers(self, run_hash: str, n_stages: int) -> dict:
        return {0: [SimpleNamespace(peer_id="12D3KooWHead", state="online", maddrs=[])],
                1: [SimpleNamespace(peer_id=STANDBY, state="online", maddrs=[])]}


async def test_the_dial_back_asks_the_coordinators_it_is_given_first_and_the_spec_without_them(run):
    spec = run.spec
    helpers = await pick_helpers(Announced(), spec, "me")  # none given: the spec's, and one peer at random
    assert helpers[0] == SPEC_PEER and len(helpers) == 2
    helpers = await pick_helpers(Announced(), spec, "me", coordinators=[STANDBY])
    assert helpers == [STANDBY, "12D3KooWHead"]  # the standby in the seat first, not asked twice as a peer
    assert await pick_helpers(Announced(), spec, "me", coordinators=[THIRD, STANDBY]) == [THIRD, STANDBY]
    assert await pick_helpers(Announced(), spec, STANDBY, coordinators=[STANDBY]) == ["12D3KooWHead"]


async def test_a_restore_asks_the_coordinators_read_at_that_moment(run):
    """The replica hands the snapshot service `ActiveCoordinator.peer_ids` itself (replica.py): read at each
    restore, so a standby that took the seat since the peer started is asked."""
    await run.peer.adopt(run.spec)
    seat = ActiveCoordinator(run.peer, run.spec.run_hash, SPEC_PEER, refresh_s=0.0)
    holders = seat.peer_ids  # what `peer.snapshots.extra_holders` is
    assert await holders() == [SPEC_PEER]
    await claim(run, STANDBY, 1)
    assert await holders() == [STANDBY]

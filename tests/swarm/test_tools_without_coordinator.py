"""The operator's tools with no coordinator up (issue 56): the dashboard reads the run spec from the peers' signed
copy once the DHT holds none (checked as a joiner checks it: `swarm/dht/spec_fetch.py`), and it and `swarm status`
say plainly that no coordinator holds the seat; over one real DHT node that re-serves the spec, `swarm status` reads
it from that peer and `swarm unban` signs its pardon with no coordinator up. In a whole swarm:
tests/e2e/test_no_coordinator_joiners.py."""
from __future__ import annotations

import asyncio
import time

import pytest

from protocol.spec import preset
from swarm.coordinator.options import sealed_spec
from swarm.dashboard.state import DashboardState
from swarm.dht import CoordinatorClaim, SignedRunSpec, SwarmDHT, close_node, start_dht
from swarm.dht.held import HeldRecords
from swarm.dht.record_service import share_records
from swarm.dht.record_share import RecordShare
from swarm.monitor.status import format_table, swarm_state
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from swarm.unban_command import UnbanOptions, unban
from tests.swarm.memory_dht import Clock, MemoryDHT
from tests.swarm.test_record_share import _asking, _held

SPEC = preset("tiny", stages=2)
COORDINATOR = "12D3KooWCoordinatorXYZ"
LIAR = "12D3KooW" + "L" * 44
RUN = {"hash": "0" * 16, "name": "tiny", "codec": "subspace", "rank": 8, "stages": 1, "key": "k" * 16}


async def _lapsed_swarm(key: SigningKey) -> tuple[MemoryDHT, str]:
    """A DHT that holds no run spec (expired) and the coordinator's claim, lapsed 100 s ago."""
    spec = sealed_spec(SPEC, key, COORDINATOR)
    dht = MemoryDHT(Clock())  # its clock is long before now: the claim's entry stays readable, as claims do
    now = time.time()
    claim = CoordinatorClaim(spec.run_hash, 1, COORDINATOR, now - 600, now - 100)
    assert await SwarmDHT(dht, Identity.generate(), swarm_key=key).publish_claim(claim, 3600)
    return dht, spec.run_hash


async def test_the_dashboard_reads_a_peers_spec_with_none_in_the_dht_and_says_no_coordinator_holds_the_seat():
    key, other = SigningKey.generate(), SigningKey.generate()
    dht, run = await _lapsed_swarm(key)
    held = _held(key, spec=sealed_spec(SPEC, key, COORDINATOR))

    alone = DashboardState(SwarmDHT(dht))  # the DHT only: nothing to show
    await alone.sample()
    assert alone.snapshot()["run"] is None and "no run spec in the DHT yet" in alone.snapshot()["error"]

    state = DashboardState(SwarmDHT(dht), peers=_asking(RecordShare(held)))
    await state.sample()
    snap = state.snapshot()
    assert snap["error"] is None and snap["run"]["hash"] == run and snap["run"]["key"] == key.fingerprint()
    assert snap["coordinator"] == {"peer": COORDINATOR, "seat_held": False, "term": None, "since": None}

    pinned = DashboardState(SwarmDHT(dht), trusted_key=other.public_bytes(), peers=_asking(RecordShare(held)))
    await pinned.sample()  # a peer's copy counts only by the pinned key, as a joiner's does
    assert pinned.snapshot()["run"] is None and "not by the trusted key" in pinned.snapshot()["error"]
    nobody = DashboardState(SwarmDHT(dht), peers=_asking(RecordShare(HeldRecords())))
    await nobody.sample()
    assert "no run spec in the DHT or at the peers asked yet" in nobody.snapshot()["error"]


def test_status_says_no_coordinator_holds_the_seat_once_every_claim_lapsed():
    lapsed = {"peer": COORDINATOR, "lease_age_s": 30, "seat_held": False, "seat_lapsed": True, "term": None,
              "since": None}
    table = format_table({"run": RUN, "stages": {}, "coordinator": lapsed})
    line = table.splitlines()[-1]  # the coordinator's line, where an active one's is
    assert line.startswith("no coordinator holds the seat (the last was …dinatorXYZ): training goes on")
    assert "no new head can lead" in line and "swarm coordinator --standby" in line
    assert "up, it re-signed" not in table, "a lease a peer re-served is no sign of a coordinator"
    never = format_table({"run": RUN, "stages": {}, "coordinator": {**lapsed, "lease_age_s": None}})
    assert "no coordinator holds the seat" in never and "no lease signed yet" not in never
    assert "at the peers asked" in format_table({"run": None, "stages": {}})


@pytest.mark.e2e
async def test_status_and_unban_read_the_spec_a_peer_holds_when_the_dht_has_none(tmp_path, capsys):
    key_file = tmp_path / "swarm.key"
    key = SigningKey.load_or_create(key_file)
    spec = sealed_spec(SPEC, key, COORDINATOR)
    identity = Identity.generate()
    dht = await asyncio.to_thread(start_dht, [], ["/ip4/127.0.0.1/tcp/0"], identity)
    p2p = sharing = None
    try:  # a peer that joined while the coordinator was up: it holds the signed spec; the DHT holds none now
        peer = SwarmDHT(dht, identity)
        peer.held.spec = SignedRunSpec.create(spec.to_json(), key)
        await peer.adopt(spec)
        now = time.time()
        lapsed = CoordinatorClaim(spec.run_hash, 1, COORDINATOR, now - 600, now - 100)
        assert await SwarmDHT(dht, Identity.generate(), swarm_key=key).publish_claim(lapsed, 600)
        p2p = await dht.replicate_p2p()
        sharing = await share_records(p2p, peer, spec, [], identity.peer_id)
        assert await peer.fetch_run_spec() is None
        maddrs = [str(m) for m in dht.get_visible_maddrs()]

        state = await swarm_state(maddrs)
        assert state["run"]["hash"] == spec.run_hash and state["run"]["key"] == key.fingerprint()
        assert state["coordinator"]["seat_lapsed"] and not state["coordinator"]["seat_held"]
        assert "no coordinator holds the seat (the last was …" in format_table(state)

        assert await unban(UnbanOptions(maddrs, str(key_file), peers=[LIAR])) == 0
        out = capsys.readouterr()
        assert f"lifted {LIAR}'s ban in run {spec.run_hash}" in out.out
        assert "note: no coordinator holds the seat; the pardon needs none" in out.err
        deadline = time.monotonic() + 15
        while not (pardons := await peer.fetch_pardons(spec.run_hash)):
            assert time.monotonic() < deadline, "the pardon never reached the peer's DHT node"
            await asyncio.sleep(0.2)  # poll the DHT
        assert list(pardons.peers) == [LIAR]
    finally:
        await close_node(dht, p2p, sharing)

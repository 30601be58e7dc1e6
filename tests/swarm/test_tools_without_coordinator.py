"""The operator's tools with no coordinator up (issue 56): the dashboard reads the run spec from the peers' signed
copy once the DHT holds none (checked as a joiner checks it: `swarm/dht/spec_fetch.py`), and it and `swarm status`
say plainly that no coordinator holds the seat. Over real processes: tests/e2e/test_no_coordinator_joiners.py."""
from __future__ import annotations

import time

from protocol.spec import preset
from swarm.coordinator.options import sealed_spec
from swarm.dashboard.state import DashboardState
from swarm.dht import CoordinatorClaim, SwarmDHT
from swarm.dht.held import HeldRecords
from swarm.dht.record_share import RecordShare
from swarm.monitor.status import format_table
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.swarm.memory_dht import Clock, MemoryDHT
from tests.swarm.test_record_share import _asking, _held

SPEC = preset("tiny", stages=2)
COORDINATOR = "12D3KooWCoordinatorXYZ"
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

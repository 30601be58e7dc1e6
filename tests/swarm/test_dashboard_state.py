"""DashboardState over one real DHT node: snapshot, bottleneck, wire figures, series, /metrics, TensorBoard."""
from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from protocol.spec import preset
from swarm.dashboard.metrics import make_registry, render
from swarm.dashboard.state import DashboardState, _mark_bottleneck, _peer_view
from swarm.dht import StageAnnouncement, SwarmDHT, start_dht, stop_dht
from swarm.local_reports import dense_bytes_per_token
from swarm.monitor.health import publish_health
from swarm.monitor.scalars import ScalarLog
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.swarm.test_health import record

SPEC = preset("tiny", stages=3)
IDENTITIES = {name: Identity.generate() for name in ("head", "middle", "stranger")}  # each signs its own records
HEAD, MIDDLE, STRANGER = (IDENTITIES[n].peer_id for n in ("head", "middle", "stranger"))
WRITER = {i.peer_id: i for i in IDENTITIES.values()}


@pytest.fixture
def sdht():
    dht = start_dht([], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        yield SwarmDHT(dht)
    finally:
        stop_dht(dht)


async def populate(sdht: SwarmDHT, ttl: float = 30.0, middle_ttl: float = 30.0) -> None:
    await sdht.publish_run_spec(SPEC.to_json(), SigningKey.generate(), ttl)
    for peer, stage, t in ((HEAD, 0, ttl), (MIDDLE, 1, middle_ttl)):
        ann = StageAnnouncement(peer, SPEC.run_hash, stage, ["/ip4/127.0.0.1/tcp/1"], 100.0, 0, 0, "online", "0.1.0",
                                leads=stage == 0)  # the only head leads
        assert await SwarmDHT(sdht.dht, WRITER[peer]).announce(ann, t)
    head = record(HEAD, run_hash=SPEC.run_hash, stage=0, step=12, tokens_per_s=6000.0, act_bytes_out=6500,
                  act_tokens_out=100, grad_bytes_out=0, grad_tokens_out=0, loss=4.0, timestamp=time.time(),
                  loss_history=[[10, 4.5, 1.0], [11, 4.2, 2.0], [12, 4.0, 3.0]])
    middle = record(MIDDLE, run_hash=SPEC.run_hash, stage=1, step=12, tokens_per_s=5000.0, act_bytes_out=6600,
                    act_tokens_out=100, grad_bytes_out=6400, grad_tokens_out=100, loss=None, loss_history=[],
                    sync_bytes_out=600_000, sync_steps=12, timestamp=time.time())
    # a validly signed record of a peer that announces no stage: listed, but not part of the swarm's figures
    stranger = record(STRANGER, run_hash=SPEC.run_hash, stage=2, basis_version=9, act_bytes_out=10**9,
                      act_tokens_out=1, banned={"12D3KooWFramed": 5}, loss_history=[[99, 0.1, 5.0]],
                      timestamp=time.time())
    for rec, t in ((head, ttl), (middle, middle_ttl), (stranger, ttl)):
        assert await publish_health(SwarmDHT(sdht.dht, WRITER[rec.peer_id]), rec, t)


def metric_values(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.e2e
async def test_snapshot_aggregates_what_the_peers_report(sdht, tmp_path):
    await populate(sdht)
    scalars = ScalarLog(tmp_path / "tb")
    state = DashboardState(sdht, scalars=scalars)
    await state.sample()
    snap = state.snapshot()

    assert snap["error"] is None and snap["run"]["hash"] == SPEC.run_hash and snap["run"]["stages"] == 3
    coverage = [(s["stage"], s["peers"], s["covered"]) for s in snap["stages"]]
    assert coverage == [(0, 1, True), (1, 1, True), (2, 0, False)]
    assert [s["bottleneck"] for s in snap["stages"]] == [False, False, True], "the uncovered stage is the bottleneck"
    peers = {p["peer_id"]: p for p in snap["peers"]}
    assert peers[HEAD]["step"] == 12 and peers[HEAD]["tokens_per_s"] == 6000.0 and peers[HEAD]["loss"] == 4.0
    assert peers[MIDDLE]["online"] and peers[MIDDLE]["loss"] is None and peers[MIDDLE]["health"]
    assert peers[STRANGER]["state"] == "unannounced" and not peers[STRANGER]["online"]

    wire = snap["wire"]
    assert wire["forward_bytes_per_token"] == pytest.approx((6500 + 6600) / 200)
    assert wire["backward_bytes_per_token"] == pytest.approx(64.0)
    assert wire["dense_bytes_per_token"] == pytest.approx(dense_bytes_per_token(SPEC))
    assert wire["compression_ratio"] == pytest.approx(dense_bytes_per_token(SPEC) / 65.5)
    assert wire["sync_bytes_per_step"] == pytest.approx(50_000) and wire["replica_sync"] == "exact"
    assert peers[MIDDLE]["sync_bytes_per_step"] == pytest.approx(50_000) and peers[HEAD]["sync_bytes_per_step"] is None
    assert snap["run"]["replica_sync"] == "exact" and snap["run"]["replica_sync_rank"] == SPEC.replica_sync_rank
    assert snap["basis"] == {"version": 2, "updated_step": 40, "mixed": False}
    assert snap["banned"] == [{"peer_id": "12D3KooWGone", "failures": 2, "reported_by": [HEAD, MIDDLE]}]
    assert snap["series"]["loss"]["step"] == [10, 11, 12] and snap["series"]["loss"]["value"] == [4.5, 4.2, 4.0]
    assert snap["series"]["tokens_per_s"]["value"] == [6000.0]

    await state.sample()  # the same records again: no duplicate points
    assert state.snapshot()["series"]["loss"]["step"] == [10, 11, 12]
    assert len(state.snapshot()["series"]["tokens_per_s"]["value"]) == 1

    values = metric_values(render(make_registry(state.snapshot)).decode())
    assert values[("swarm_peer_step", (("peer", HEAD), ("stage", "0")))] == 12
    assert values[("swarm_peer_loss", (("peer", HEAD), ("stage", "0")))] == 4.0
    assert ("swarm_peer_loss", (("peer", MIDDLE), ("stage", "1"))) not in values
    assert values[("swarm_peer_basis_version", (("peer", MIDDLE), ("stage", "1")))] == 2
    assert values[("swarm_stages_covered", ())] == 2 and values[("swarm_peers", ())] == 2
    assert values[("swarm_invalid_records", ())] == 0
    assert values[("swarm_sync_bytes_per_step", ())] == 50_000
    assert values[("swarm_peer_sync_bytes_per_step", (("peer", MIDDLE), ("stage", "1")))] == 50_000
    assert not any(labels and dict(labels)["peer"] == STRANGER for _, labels in values)

    scalars.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("swarm/loss")] == [(10, 4.5), (11, pytest.approx(4.2)), (12, 4.0)]
    assert acc.Scalars("swarm/stages_covered")[-1].value == 2


@pytest.mark.e2e
async def test_a_peer_whose_records_expire_is_shown_offline(sdht):
    await populate(sdht, middle_ttl=2.0)
    state = DashboardState(sdht)
    await state.sample()
    assert {p["peer_id"]: p["state"] for p in state.snapshot()["peers"]}[MIDDLE] == "online"
    deadline = time.monotonic() + 15
    while True:
        await state.sample()
        snap = state.snapshot()
        middle = {p["peer_id"]: p for p in snap["peers"]}[MIDDLE]
        if middle["state"] == "offline":
            break
        assert time.monotonic() < deadline, f"the expired peer still shows as {middle['state']}"
        await asyncio.sleep(0.2)  # poll the DHT until the 2 s records expire
    assert not middle["online"] and snap["stages"][1]["peers"] == 0 and snap["stages"][1]["bottleneck"]


@pytest.mark.e2e
async def test_without_a_run_spec_the_snapshot_says_so(sdht):
    state = DashboardState(sdht)
    await state.sample()
    snap = state.snapshot()
    assert snap["run"] is None and "no run spec" in snap["error"]
    assert metric_values(render(make_registry(state.snapshot)).decode())[("swarm_peers", ())] == 0


def test_a_stage_is_the_bottleneck_when_uncovered_or_clearly_slowest():
    def marks(*speeds):
        stages = [{"stage": i, "tokens_per_s": v, "covered": v is not None, "bottleneck": False}
                  for i, v in enumerate(speeds)]
        for st in stages:
            st["tokens_per_s"] = st["tokens_per_s"] or 0.0
        _mark_bottleneck(stages)
        return [st["bottleneck"] for st in stages]

    assert marks(5000.0, 4800.0, 5100.0) == [False, False, False], "noise is not a bottleneck"
    assert marks(5000.0, 2000.0, 5100.0) == [False, True, False]
    assert marks(5000.0, None, None) == [False, True, True]
    assert marks(0.0, 0.0, 0.0) == [False, False, False]


class FakeProbe:
    """Stands in for LivenessProbe: says who answers, or fails the whole round."""

    def __init__(self, silent: set[str] = frozenset(), broken: bool = False) -> None:
        self.silent, self.broken, self.rounds = set(silent), broken, []

    async def probe_all(self, run_hash: str, peers: list[str]) -> dict[str, bool]:
        self.rounds.append((run_hash, sorted(peers)))
        if self.broken:
            raise ConnectionError("p2pd went away")
        return {p: p not in self.silent for p in peers}


@pytest.mark.e2e
async def test_a_peer_that_misses_two_probes_is_offline_while_its_records_live(sdht):
    await populate(sdht, ttl=60.0)  # its records outlive this test
    probe = FakeProbe(silent={MIDDLE})
    state = DashboardState(sdht, probe=probe)
    await state.probe_once()  # nothing listed before the first sample: nothing to probe
    assert probe.rounds == []
    await state.sample()
    for _ in range(2):
        await state.probe_once()
    assert probe.rounds[-1] == (SPEC.run_hash, sorted([HEAD, MIDDLE, STRANGER]))
    await state.sample()
    snap = state.snapshot()
    peers = {p["peer_id"]: p for p in snap["peers"]}
    assert peers[MIDDLE]["state"] == "offline" and not peers[MIDDLE]["online"] and peers[MIDDLE]["answers"] is False
    assert peers[HEAD]["online"] and peers[HEAD]["answers"] is True
    assert [(s["peers"], s["covered"]) for s in snap["stages"]] == [(1, True), (0, False), (0, False)]
    assert snap["wire"]["forward_bytes_per_token"] == pytest.approx(65.0), "the silent peer's figures are left out"
    assert snap["wire"]["sync_bytes_per_step"] is None
    values = metric_values(render(make_registry(state.snapshot)).decode())
    assert values[("swarm_peers", ())] == 1 and values[("swarm_stages_covered", ())] == 1

    probe.silent.clear()  # it answers again
    await state.probe_once()
    await state.sample()
    peers = {p["peer_id"]: p for p in state.snapshot()["peers"]}
    assert peers[MIDDLE]["online"] and peers[MIDDLE]["answers"] is True
    assert state.snapshot()["stages"][1]["covered"]


@pytest.mark.e2e
async def test_a_failing_probe_never_stops_the_dashboard(sdht):
    await populate(sdht)
    probe = FakeProbe(broken=True)
    state = DashboardState(sdht, interval=0.1, probe=probe)
    task = asyncio.create_task(state.run())
    try:
        deadline = time.monotonic() + 20
        while not (probe.rounds and state.samples >= 3):
            assert not task.done(), f"the dashboard stopped: {task.exception() if task.done() else ''}"
            assert time.monotonic() < deadline, "no probe round and three samples within 20 s"
            await asyncio.sleep(0.1)  # poll the sampling task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    snap = state.snapshot()
    assert snap["error"] is None and sum(p["online"] for p in snap["peers"]) == 2
    assert all(p["answers"] is None for p in snap["peers"]), "a failed round is no verdict"


def test_a_standby_head_s_measured_speed_is_shown_as_such_not_as_traffic():
    def ann(peer: str, leads: bool) -> StageAnnouncement:
        return StageAnnouncement(peer, SPEC.run_hash, 0, [], 900.0, 0, 0, "online", "0.1.0", leads=leads)
    now = time.time()
    leader, standby = _peer_view(ann(HEAD, True), None, None, now), _peer_view(ann(MIDDLE, False), None, None, now)
    assert not leader["standby"] and leader["tokens_per_s"] == 900.0 and leader["measured_tokens_per_s"] is None
    assert standby["standby"] and standby["tokens_per_s"] == 0.0 and standby["measured_tokens_per_s"] == 900.0
    # with a health record, the traffic is the record's (a standby head passes none), the measured speed stays
    beat = record(MIDDLE, run_hash=SPEC.run_hash, stage=0, tokens_per_s=0.0, timestamp=now)
    assert _peer_view(ann(MIDDLE, False), beat, None, now)["measured_tokens_per_s"] == 900.0

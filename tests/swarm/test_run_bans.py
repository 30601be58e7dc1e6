"""Bans for the run and the swarm key's pardons (issue 57, item 3): `swarm/replicas/run_bans.py`, read by the
router with the lease; `swarm status` and the dashboard list bans with the leader's reason; `swarm unban` (the
real console script over a real DHT) lifts them."""
from __future__ import annotations

import asyncio
import time

import pytest

from protocol.spec import preset
from swarm.dht import Pardons, RecordError, SwarmDHT
from swarm.monitor.status import format_table
from swarm.replicas.router import Router
from swarm.replicas.run_bans import PARDON_GRACE_S, RunBans
from swarm.trust.admission import AdmissionPolicy
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.e2e.test_bad_input import run_swarm
from tests.swarm.test_dht import eventually, swarm  # noqa: F401  (the fixture: two real DHT nodes)

RUN = "0123456789abcdef"
LIAR, HONEST = "12D3KooWLiar" + "x" * 40, "12D3KooWHonest" + "y" * 38


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_pardon_lifts_a_ban_told_before_it_and_a_later_conviction_bans_again():
    clock, pardoned = Clock(), []
    bans = RunBans(clock)
    bans.on_pardon.append(pardoned.append)
    assert bans.add(LIAR, "its share was recomputed to other numbers") and not bans.add(LIAR)  # once
    assert bans.add(HONEST)
    assert bans.listed() == {LIAR: "its share was recomputed to other numbers", HONEST: ""}
    clock.now += 30
    assert bans.pardon({HONEST: clock.now - 1}) == [HONEST] and HONEST not in bans and LIAR in bans
    assert pardoned == [HONEST]
    assert bans.pardon({HONEST: clock.now - 1}) == [] and pardoned == [HONEST]  # the same pardon read again: once
    clock.now += PARDON_GRACE_S / 2
    assert not bans.add(HONEST) and HONEST not in bans  # an abort from before the leader read the pardon
    clock.now += PARDON_GRACE_S
    assert bans.add(HONEST, "lied again") and bans.listed()[HONEST] == "lied again"  # a new conviction holds
    assert bans.pardon({HONEST: 1000.0 + 29}) == []  # an old pardon does not lift it


class Pardoning:
    """The DHT as a router reads it: no lease, and the swarm key's pardons (or a refusal to read them)."""

    def __init__(self, pardons: dict[str, float] | None) -> None:
        self.pardons, self.reads = pardons, 0

    async def fetch_lease(self, run_hash: str):
        return None

    async def fetch_pardons(self, run_hash: str) -> Pardons | None:
        self.reads += 1
        if self.pardons is None:
            raise RecordError("no coordinator key to trust")
        return Pardons(run_hash, self.pardons)


async def test_the_router_reads_pardons_with_the_lease_at_most_every_few_seconds_and_forgets_the_ban():
    clock = Clock()
    dht = Pardoning({})
    router = Router(dht, RUN, "me", [], clock=clock)
    router.run_bans.clock = clock
    router.ban(LIAR, "false work")
    assert router.is_banned(LIAR) and router.run_bans_listed() == {LIAR: "false work"}
    await router.lease()
    dht.pardons = {LIAR: clock.now + 1}  # `swarm unban` now
    clock.now += 1
    await router.lease(fresh=True)
    assert router.is_banned(LIAR) and dht.reads == 1  # read again only after PARDONS_READ_S
    clock.now += 10
    await router.lease(fresh=True)
    assert not router.is_banned(LIAR) and router.run_bans_listed() == {} and dht.reads == 2
    broken = Router(Pardoning(None), RUN, "me", [], clock=clock)
    broken.ban(LIAR)
    await broken.lease()  # no key to trust the pardons by: the ban stays, nothing raised
    assert broken.is_banned(LIAR)


def test_status_lists_bans_with_the_leaders_reason_and_how_to_lift_them():
    spec = preset("tiny", stages=2)
    state = {"run": {"hash": spec.run_hash, "name": "tiny", "codec": spec.codec, "rank": spec.rank, "stages": 2,
                     "key": "k" * 16}, "stages": {}, "paused": {}, "revoked": [],
             "coordinator": {"peer": None, "lease_age_s": None},
             "bans": [{"peer": LIAR, "reason": "it reports microbatch 3 as other bytes than its sender signed",
                       "reported_by": ["a", "b"]}]}
    table = format_table(state)
    assert f"banned for the run: …{LIAR[-10:]}: it reports microbatch 3" in table
    assert "coordinator (not named in the run spec): no lease signed yet" in table
    assert "reported by 2 peers" in table and f"swarm unban {LIAR}" in table


@pytest.mark.e2e
async def test_swarm_unban_signs_a_pardon_every_reader_of_the_run_trusts(swarm, tmp_path):  # noqa: F811
    keyfile = tmp_path / "swarm.key"
    key = SigningKey.load_or_create(keyfile)
    coordinator = SwarmDHT(swarm.first.dht, Identity.of_key(key), swarm_key=key,
                           policy=AdmissionPolicy(False, key.public_bytes()))
    spec = preset("tiny", stages=2).replace(coordinator_key=key.public_bytes().hex())  # as the coordinator seals it
    await coordinator.publish_run_spec(spec.to_json(), key, 600)
    maddrs = [str(m) for m in swarm.first.dht.get_visible_maddrs()]
    stranger = tmp_path / "stranger.key"
    SigningKey.load_or_create(stranger)
    refused = await asyncio.to_thread(run_swarm, "unban", LIAR, "--initial-peers", *maddrs, "--key", str(stranger),
                                      tmp_path=tmp_path)
    assert refused.returncode == 1 and "only the swarm key's holder lifts bans" in refused.stderr
    bad = await asyncio.to_thread(run_swarm, "unban", "not-an-id", "--initial-peers", *maddrs, "--key",
                                  str(keyfile), tmp_path=tmp_path)
    assert bad.returncode == 2 and "is not a peer id" in bad.stderr
    done = await asyncio.to_thread(run_swarm, "unban", LIAR, "--initial-peers", *maddrs, "--key", str(keyfile),
                                   tmp_path=tmp_path)
    assert done.returncode == 0 and f"lifted {LIAR}'s ban in run {spec.run_hash}" in done.stdout, done.stderr
    reader_dht = SwarmDHT(swarm.second.dht, Identity.generate())
    await reader_dht.adopt(spec)
    pardons = await eventually(lambda: reader_dht.fetch_pardons(spec.run_hash))
    assert list(pardons.peers) == [LIAR]
    router = Router(reader_dht, spec.run_hash, "me", [])
    router.ban(LIAR, "false work")
    await router.lease()
    assert not router.is_banned(LIAR)
    again = await asyncio.to_thread(run_swarm, "unban", HONEST, "--initial-peers", *maddrs, "--key", str(keyfile),
                                    tmp_path=tmp_path)
    assert again.returncode == 0
    both = await eventually(lambda: _with(reader_dht, spec.run_hash, HONEST))
    assert sorted(both.peers) == sorted([LIAR, HONEST])  # an earlier pardon is kept


async def _with(sdht: SwarmDHT, run: str, peer: str) -> Pardons | None:
    found = await sdht.fetch_pardons(run)
    return found if found is not None and peer in found.peers else None


def test_status_says_whether_the_coordinator_is_up_from_the_age_of_its_lease():
    run = {"hash": "0" * 16, "name": "tiny", "codec": "subspace", "rank": 8, "stages": 1, "key": "k" * 16}
    up = format_table({"run": run, "stages": {}, "coordinator": {"peer": "12D3KooWcoordinatorXYZ", "lease_age_s": 12}})
    assert "coordinator …dinatorXYZ: up, it re-signed the leader lease 12 s ago." in up
    down = format_table({"run": run, "stages": {}, "coordinator": {"peer": "12D3KooWcoordinatorXYZ",
                                                                   "lease_age_s": 600}})
    assert "looks down, its last lease is 10 min old" in down and "no new head can lead" in down
    since = 1796600000.0
    seated = format_table({"run": run, "stages": {}, "coordinator": {"peer": "12D3KooWstandbyABCDE", "lease_age_s": 4,
                                                                     "seat_held": True, "term": 3, "since": since}})
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
    assert f"coordinator …andbyABCDE: active since {when} (term 3)" in seated


def test_a_leaders_health_record_carries_a_whole_ban_reason_and_refuses_a_longer_one():
    """A leader's reasons run past 128 characters ("blamed by 2 of the 2 other replicas of stage 1: replica ...
    ended its reduce ..."): the record takes up to MAX_REASON of them (it refused such a record at first)."""
    from swarm.dht import RecordError
    from swarm.monitor.health import MAX_REASON
    from tests.swarm.test_health import record
    why = "blamed by 2 of the 2 other replicas of stage 1: " + "x" * 300
    assert record(run_bans={LIAR: why}).run_bans == {LIAR: why}
    with pytest.raises(RecordError):
        record(run_bans={LIAR: "x" * (MAX_REASON + 1)})

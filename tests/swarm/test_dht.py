"""Swarm records over two real hivemind DHT nodes on 127.0.0.1 (each signs with its own libp2p identity)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from dataclasses import dataclass, replace

import pytest
from hivemind.utils import get_dht_time

from protocol.spec import preset
from swarm.dht import (
    CLOCK_SKEW_S,
    RUN_KEY,
    Envelope,
    RecordError,
    SignedRunSpec,
    StageAnnouncement,
    SwarmDHT,
    refused_records,
    run_hash_of,
    set_policy,
    stage_key,
    start_dht,
    stop_dht,
)
from swarm.dht.process import _p2pd_children
from swarm.trust.admission import AdmissionError, AdmissionPolicy, Ticket
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
SPEC = json.dumps({"model": {"d": 64, "layers": 4}, "stages": 2, "codec": "subspace"}, sort_keys=True)


@dataclass
class Swarm:
    first: SwarmDHT
    second: SwarmDHT

    @property
    def me(self) -> str:
        """The first node's peer id: the only one it may announce."""
        return self.first.identity.peer_id


@pytest.fixture
def swarm():
    dhts = []
    try:
        ids = Identity.generate(), Identity.generate()
        dhts.append(start_dht([], host_maddrs=LOCAL, identity=ids[0]))
        first = SwarmDHT(dhts[0], ids[0])
        maddrs = [str(m) for m in dhts[0].get_visible_maddrs()]
        dhts.append(start_dht(maddrs, host_maddrs=LOCAL, identity=ids[1]))
        yield Swarm(first, SwarmDHT(dhts[1], ids[1]))
    finally:
        for dht in dhts:
            stop_dht(dht)


async def eventually(check, timeout: float = 15.0, interval: float = 0.2):
    """Poll `check()` (async) until it returns something truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s (last result: {result!r})")
        await asyncio.sleep(interval)


def announcement(peer_id: str, stage: int = 1, run_hash: str | None = None, **overrides) -> StageAnnouncement:
    base = StageAnnouncement(
        peer_id=peer_id, run_hash=run_hash or run_hash_of(SPEC), stage=stage, maddrs=["/ip4/127.0.0.1/tcp/1"],
        throughput=1234.5, queue=2, basis_version=3, state="online", version="0.1.0",
    )
    return replace(base, **overrides)


@pytest.mark.e2e
async def test_publish_and_fetch_run_spec(swarm):
    key = SigningKey.generate()
    assert await swarm.second.fetch_run_spec() is None
    published = await swarm.first.publish_run_spec(SPEC, key, ttl=60)
    assert published.run_hash == run_hash_of(SPEC) and len(published.run_hash) == 16
    fetched = await eventually(lambda: swarm.second.fetch_run_spec(trusted_key=key.public_bytes()))
    assert fetched == published
    assert json.loads(fetched.spec_json) == json.loads(SPEC)
    assert await swarm.second.fetch_run_spec() == published


@pytest.mark.e2e
async def test_run_spec_by_another_key_is_refused_when_pinned(swarm):
    real, impostor = SigningKey.generate(), SigningKey.generate()
    await swarm.first.publish_run_spec(SPEC.replace("subspace", "dense"), impostor, ttl=60)
    with pytest.raises(RecordError, match="not by the trusted key"):
        await swarm.second.fetch_run_spec(trusted_key=real.public_bytes())
    # Once the real coordinator publishes too, pinning picks it; without a pin it is ambiguous.
    await swarm.first.publish_run_spec(SPEC, real, ttl=60)
    fetched = await swarm.second.fetch_run_spec(trusted_key=real.public_bytes())
    assert fetched.public_key == real.public_bytes() and fetched.spec_json == SPEC
    with pytest.raises(RecordError, match="several keys"):
        await swarm.second.fetch_run_spec()


@pytest.mark.e2e
@pytest.mark.parametrize("tamper", ["signature", "spec", "spec_and_hash"])
async def test_run_spec_that_does_not_verify_is_refused(swarm, tamper):
    key = SigningKey.generate()
    good = SignedRunSpec.create(SPEC, key)
    other = SPEC.replace("64", "65")
    bad = {
        "signature": replace(good, signature=bytes([good.signature[0] ^ 1]) + good.signature[1:]),
        "spec": replace(good, spec_json=other),
        "spec_and_hash": replace(good, spec_json=other, run_hash=run_hash_of(other)),
    }[tamper]
    # filed in a valid envelope by the key's holder, so the DHT stores it; only the reader can tell
    expiry = get_dht_time() + 60
    envelope = Envelope.seal(RUN_KEY, key.fingerprint(), bad.to_record(), expiry, Identity.of_key(key))
    stored = await swarm.first.dht.store(RUN_KEY, envelope.to_value(), expiry, subkey=key.fingerprint(),
                                         return_future=True)
    assert stored
    with pytest.raises(RecordError, match="does not verify|does not match"):
        await swarm.second.fetch_run_spec(trusted_key=key.public_bytes())
    with pytest.raises(RecordError):
        await swarm.second.fetch_run_spec()
    assert swarm.second.skipped_records >= 1


@pytest.mark.e2e
async def test_announcements_appear_and_vanish_after_ttl(swarm):
    run_hash = run_hash_of(SPEC)
    ann = announcement(swarm.me, stage=1)
    assert await swarm.first.announce(ann, ttl=2.0)
    seen = await eventually(lambda: swarm.second.stage_peers(run_hash, 1))
    assert seen == [ann]
    assert await swarm.second.stage_peers(run_hash, 0) == []
    everything = await swarm.second.all_stage_peers(run_hash, 3)
    assert everything == {0: [], 1: [ann], 2: []}
    announced_at = time.monotonic()

    async def gone():
        return await swarm.second.stage_peers(run_hash, 1) == []

    await eventually(gone, timeout=15.0)
    assert time.monotonic() - announced_at > 1.0  # it did live for about its ttl, not less


@pytest.mark.e2e
async def test_heartbeat_keeps_a_peer_alive_until_cancelled(swarm):
    run_hash = run_hash_of(SPEC)
    beats = []

    def make():
        beats.append(time.monotonic())
        return announcement(swarm.me, stage=0, queue=len(beats))

    task = asyncio.create_task(swarm.first.heartbeat(make, ttl=1.5, period=0.3))
    try:
        await eventually(lambda: swarm.second.stage_peers(run_hash, 0))
        # Stays visible for well over one ttl, because each beat extends the expiration.
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            assert [a.peer_id for a in await swarm.second.stage_peers(run_hash, 0)] == [swarm.me]
            await asyncio.sleep(0.25)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(beats) >= 5

    async def gone():
        return await swarm.second.stage_peers(run_hash, 0) == []

    await eventually(gone)
    with pytest.raises(ValueError, match="shorter than the ttl"):
        await swarm.first.heartbeat(make, ttl=1.0, period=1.0)


@pytest.mark.e2e
async def test_malformed_announcements_are_skipped_and_counted(swarm):
    run_hash = run_hash_of(SPEC)
    key = stage_key(run_hash, 2)
    expiry = get_dht_time() + 60
    good = announcement(swarm.me, stage=2)
    # Each is signed by the peer it is filed under, so the DHT keeps it: the body is that peer's
    # own business, and only a reader can tell it is junk.
    junk = {}
    for make in (lambda p: {"peer_id": 5}, lambda p: "not even a map",
                 lambda p: announcement(p, stage=2).to_record() | {"state": "dancing"},
                 lambda p: announcement("12D3KooWsomeoneelse", stage=2).to_record(),
                 lambda p: announcement(p, stage=2).to_record() | {"throughput": float("nan")},
                 lambda p: announcement(p, stage=3).to_record()):
        writer = Identity.generate()
        junk[writer.peer_id] = Envelope.seal(key, writer.peer_id, make(writer.peer_id), expiry, writer)
    for subkey, envelope in junk.items():
        assert await swarm.first.dht.store(key, envelope.to_value(), expiry, subkey=subkey, return_future=True)
    # What is not a signed envelope at all is refused by the DHT nodes themselves.
    assert not await swarm.first.dht.store(key, good.to_record(), expiry, subkey=swarm.me, return_future=True)
    assert await swarm.first.announce(good, ttl=60)

    async def complete():
        swarm.second.skipped_records = 0
        peers = await swarm.second.stage_peers(run_hash, 2)
        return (peers, swarm.second.skipped_records) if peers else None

    assert await eventually(complete) == ([good], len(junk))
    with pytest.raises(ValueError, match="announces only itself"):
        await swarm.first.announce(announcement(swarm.second.identity.peer_id, stage=2), ttl=60)


@pytest.mark.e2e
async def test_visible_maddrs_and_stop_leaves_no_p2pd(swarm):
    maddrs = await swarm.first.visible_maddrs()
    assert maddrs and all(m.startswith("/ip4/127.0.0.1/tcp/") and "/p2p/" in m for m in maddrs)
    identity = Identity.generate()
    dht = start_dht([], host_maddrs=LOCAL, identity=identity)
    assert dht.peer_id.to_base58() == identity.peer_id  # p2pd runs as the identity Python signs with
    daemons = _p2pd_children(dht.pid)
    assert len(daemons) == 1
    stop_dht(dht)
    assert not dht.is_alive()
    assert _p2pd_children(dht.pid) == []
    with pytest.raises(ProcessLookupError):
        os.kill(daemons[0], 0)


@pytest.mark.parametrize(
    "field, value",
    [("stage", -1), ("stage", True), ("state", "asleep"), ("throughput", float("inf")), ("maddrs", "x"),
     ("peer_id", ""), ("queue", 1.5), ("version", None), ("maddrs", [1])],
)
def test_announcement_validation(field, value):
    with pytest.raises(RecordError):
        StageAnnouncement(**(announcement("12D3KooWpeer").to_record() | {field: value}))


def test_announcement_record_round_trip_ignores_unknown_fields():
    ann = announcement("12D3KooWpeer")
    assert StageAnnouncement.from_record(ann.to_record() | {"from_the_future": 1}) == ann
    with pytest.raises(RecordError, match="lacks"):
        StageAnnouncement.from_record({"peer_id": "x"})
    with pytest.raises(RecordError, match="must be a map"):
        StageAnnouncement.from_record([1, 2])


@pytest.mark.e2e
async def test_a_node_that_learns_the_swarm_is_private_drops_what_it_no_longer_accepts(swarm):
    run_hash = run_hash_of(SPEC)
    swarm_key = SigningKey.generate()
    # while both nodes take the swarm for public, a ticketless announcement is stored on both
    assert await swarm.first.announce(announcement(swarm.me, stage=1), ttl=60)
    await eventually(lambda: swarm.second.stage_peers(run_hash, 1))
    spec = preset("tiny").replace(coordinator_key=swarm_key.public_bytes().hex(), extra={"private": True})
    with pytest.raises(AdmissionError, match="has no ticket"):
        await swarm.first.adopt(spec)  # a writer without a ticket is refused, before it writes anything
    assert await set_policy(swarm.first.dht, AdmissionPolicy.for_spec(spec)) >= 1
    reader = SwarmDHT(swarm.second.dht)  # writes nothing, so it needs no ticket to adopt the rule
    await reader.adopt(spec)
    assert await reader.stage_peers(run_hash, 1) == []  # dropped by both nodes: no node serves it
    assert not await swarm.first.announce(announcement(swarm.me, stage=1), ttl=60)  # refused by both now
    refused, reasons = await refused_records(swarm.first.dht)
    assert refused >= 2 and any("has no ticket" in r for r in reasons)

    # with a ticket from the swarm key, the same peer is in
    admitted = SwarmDHT(swarm.first.dht, swarm.first.identity, ticket=Ticket.issue(swarm_key, swarm.me))
    await admitted.adopt(spec)
    assert await admitted.announce(announcement(swarm.me, stage=1, queue=7), ttl=60)
    peers = await eventually(lambda: reader.stage_peers(run_hash, 1))
    assert [(p.peer_id, p.queue) for p in peers] == [(swarm.me, 7)]
    assert reader.admission.admits(swarm.me) and not reader.admission.admits("12D3KooWstranger")


async def _lag_clock(_dht, _node, seconds: float) -> None:
    # runs in the DHT's process: its validator now reads a clock `seconds` behind everyone else's
    import swarm.dht.validator as validator
    real = validator.get_dht_time
    validator.get_dht_time = lambda: real() - seconds


@pytest.mark.e2e
async def test_a_record_at_the_edge_of_the_expiry_bound_cannot_hide_a_stage_from_a_lagging_reader(swarm):
    run_hash = run_hash_of(SPEC)
    key = stage_key(run_hash, 1)
    assert await swarm.first.announce(announcement(swarm.me, stage=1), ttl=60)
    edge = Identity.generate()  # a peer of its own, writing as far ahead as the storing nodes allow
    expiry = get_dht_time() + 300 + CLOCK_SKEW_S - 2
    value = Envelope.seal(key, edge.peer_id, announcement(edge.peer_id, stage=1).to_record(), expiry, edge).to_value()
    assert await swarm.first.dht.store(key, value, expiry, subkey=edge.peer_id, return_future=True)

    maddrs = [str(m) for m in swarm.first.dht.get_visible_maddrs()]
    lagging = await asyncio.to_thread(start_dht, maddrs, LOCAL, None, True)
    try:
        await lagging.run_coroutine(functools.partial(_lag_clock, seconds=30.0), return_future=True)
        reader = SwarmDHT(lagging)
        # hivemind drops a lookup reply whole if one entry fails: were the bound checked on replies,
        # this reader would see no peer of the stage at all
        peers = await eventually(lambda: reader.stage_peers(run_hash, 1))
        assert {p.peer_id for p in peers} == {swarm.me, edge.peer_id}
    finally:
        await asyncio.to_thread(stop_dht, lagging)

"""At most a few ids per stage per /24 or /48, and a few more per /16 or /32 (`swarm/dht/network_cap.py`), and what
a reader (`SwarmDHT.stage_peers`) skips: announcements without a proof of work, and ids over their network's or
block's cap, counted where this node's connections see them, never where their announcements claim to be."""
from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import PeerInfo
from hivemind.utils import ValueWithExpiration
from hivemind.utils.multiaddr import Multiaddr

from protocol.spec import preset
from swarm.coordinator import CoordinatorOptions, sealed_spec
from swarm.dht import Envelope, StageAnnouncement, SwarmDHT, SwarmRecordValidator, stage_key
from swarm.dht.network_cap import block_of, cap_per_network, network_of
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from swarm.trust.work import find_proof, proof_for


def test_the_network_of_an_address():
    assert network_of("/ip4/9.9.9.77/tcp/4001") == "9.9.9.0/24"
    assert network_of("/ip6/2a01:4f8:1:2::5/tcp/4001") == "2a01:4f8:1::/48"
    for exempt in ("/ip4/127.0.0.1/tcp/1", "/ip4/192.168.1.5/tcp/1", "/ip4/10.0.0.1/tcp/1", "/ip6/::1/tcp/1",
                   "/ip4/100.64.0.1/tcp/1", "/ip4/9.9.9.9/tcp/1/p2p/12D3KooWrelay/p2p-circuit", "/dns4/a.org/tcp/1",
                   "/ip4/not-an-ip/tcp/1", "", "/unix/x"):
        assert network_of(exempt) is None, exempt


def peers(*ids: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(peer_id=i) for i in ids]


def test_over_the_cap_the_ids_seen_first_stay_and_claims_count_for_nothing():
    everyone = peers("victim", "a1", "a2", "a3", "a4", "fake1", "fake2", "lan1", "lan2", "lan3")
    seen_at = {"victim": ["/ip4/9.9.9.5/tcp/1"],
               **{f"a{i}": [f"/ip4/7.7.7.{i}/tcp/1"] for i in range(1, 5)},  # one machine's block
               **{f"lan{i}": [f"/ip4/192.168.0.{i}/tcp/1"] for i in range(1, 4)}}
    first_seen = {"a3": 1.0, "a1": 2.0, "a2": 3.0, "a4": 4.0, "victim": 9.0}
    kept, skipped = cap_per_network(everyone, 2, seen_at, first_seen)
    assert [p.peer_id for p in skipped] == ["a2", "a4"]  # a3 and a1 came first
    # the fakes (whatever their announcements claim) have no connection here: not counted, not crowding anyone
    assert {p.peer_id for p in kept} == {"victim", "a1", "a3", "fake1", "fake2", "lan1", "lan2", "lan3"}
    assert cap_per_network(everyone, 0, seen_at, first_seen) == (everyone, [])


def test_the_block_of_a_network():
    assert block_of("9.9.9.0/24") == "9.9.0.0/16"
    assert block_of("2a01:4f8:1::/48") == "2a01:4f8::/32"
    assert block_of(network_of("/ip6/2001:470:ffff:1::7/tcp/4001")) == "2001:470::/32"


def test_many_networks_of_one_block_field_the_block_cap_and_no_more():
    """An attacker with 40 /48s of one /32 (a tunnel broker's, or a hoster's that hands out a /48 per customer) and
    40 /24s of one /16, each id seen before any honest one: 4 per network and 16 per block stay, the earliest."""
    v6 = [f"v6_{i:02d}" for i in range(40)]
    v4 = [f"v4_{i:02d}" for i in range(40)]
    crowd = [f"one48_{i}" for i in range(6)]  # 6 ids in one /48 of a third provider: its network cap still holds
    honest = ["h_isp6", "h_isp4", "h_same32"]
    exempt = ["lan", "loop", "relayed", "fake"]  # private, loopback, relay circuit, no connection: never counted
    seen_at = {**{p: [f"/ip6/2001:470:{i + 1:x}::1/tcp/1"] for i, p in enumerate(v6)},
               **{p: [f"/ip4/7.7.{i}.1/tcp/1"] for i, p in enumerate(v4)},
               **{p: [f"/ip6/2a0e:1:2::{i + 1}/tcp/1"] for i, p in enumerate(crowd)},
               "h_isp6": ["/ip6/2003:e1:1::5/tcp/1"], "h_isp4": ["/ip4/9.9.9.5/tcp/1"],
               "h_same32": ["/ip6/2001:470:beef::5/tcp/1"],  # an honest volunteer of the attacker's /32, seen first
               "lan": ["/ip4/192.168.0.7/tcp/1"], "loop": ["/ip4/127.0.0.1/tcp/1"],
               "relayed": ["/ip4/5.5.5.5/tcp/1/p2p/12D3KooWrelay/p2p-circuit"]}
    everyone = peers(*v6, *v4, *crowd, *honest, *exempt)
    first_seen = {"h_same32": 0.0, **{p: 1.0 + i for i, p in enumerate(v6 + v4 + crowd)},
                  "h_isp6": 500.0, "h_isp4": 501.0}
    kept, skipped = cap_per_network(everyone, 4, seen_at, first_seen, per_block=16)
    kept_ids = [p.peer_id for p in kept]
    assert [p for p in kept_ids if p.startswith("v6_")] == v6[:15], "16 per /32: the honest one seen first, 15 more"
    assert [p for p in kept_ids if p.startswith("v4_")] == v4[:16]
    assert [p for p in kept_ids if p.startswith("one48_")] == crowd[:4]
    assert set(honest) | set(exempt) <= set(kept_ids), "other blocks, and uncounted ids, are not crowded out"
    assert {p.peer_id for p in skipped} == set(v6[15:] + v4[16:] + crowd[4:])
    assert kept_ids == [p.peer_id for p in everyone if p.peer_id in kept_ids], "in the callers' order"
    # without the block cap (a spec from before it): 4 per network, so every one of those networks' ids stays
    kept_old, skipped_old = cap_per_network(everyone, 4, seen_at, first_seen)
    assert {p.peer_id for p in skipped_old} == set(crowd[4:]) and len(kept_old) == len(everyone) - 2
    # the block cap alone (no network cap): 16 per block, whatever its networks
    assert len(cap_per_network(everyone, 0, seen_at, first_seen, per_block=16)[1]) == (41 - 16) + (40 - 16)


def test_the_coordinator_states_the_block_cap_in_the_run_spec_and_old_specs_have_none():
    key = SigningKey.generate()
    spec = sealed_spec(preset("tiny"), key, ids_per_network=4, ids_per_block=16)
    assert (spec.extra["ids_per_network"], spec.extra["ids_per_block"]) == (4, 16)
    assert "ids_per_block" not in sealed_spec(preset("tiny"), key, ids_per_network=4).extra  # 0: as before
    assert CoordinatorOptions(preset("tiny")).ids_per_block == 16  # a public swarm's default
    with pytest.raises(ValueError, match="--ids-per-block must be 0"):
        CoordinatorOptions(preset("tiny"), ids_per_block=-1).check()
    reader = SwarmDHT(FakeDHT())
    asyncio.run(reader.adopt(RUN_SPEC))  # a spec without the setting (an older coordinator's)
    assert (reader.ids_per_network, reader.ids_per_block) == (2, 0)
    for junk in ("16", True, -3, 2.5):
        asyncio.run(reader.adopt(RUN_SPEC.replace(extra={**RUN_SPEC.extra, "ids_per_block": junk})))
        assert reader.ids_per_block == 0, junk


RUN_SPEC = sealed_spec(preset("tiny", stages=2), SigningKey.generate(), id_work_bits=8, ids_per_network=2)
RUN, BITS = RUN_SPEC.run_hash, 8


class FakeDHT:
    """What SwarmDHT asks of a hivemind.DHT to read one stage: `get`, and p2pd's connections via `run_coroutine`."""

    def __init__(self, run: str = RUN) -> None:
        self.run = run
        self.entries: dict[str, ValueWithExpiration] = {}
        self.connections: dict[str, list[str]] = {}  # peer id -> remote addresses

    def put(self, who: Identity, claimed: list[str], proven: bool = True) -> None:
        ann = StageAnnouncement(who.peer_id, self.run, 1, claimed, 1e9, 0, 0, "online", "0.1.0")
        expiry = time.time() + 30
        nonce = find_proof(self.run, who.peer_id, BITS)[0] if proven else None
        env = Envelope.seal(stage_key(self.run, 1), who.peer_id, ann.to_record(), expiry, who, work=nonce)
        self.entries[who.peer_id] = ValueWithExpiration(env.to_value(), expiry)

    async def store(self, key, value, expiration, subkey=None, return_future=True):
        self.entries[subkey] = ValueWithExpiration(value, expiration)
        return True

    async def get(self, key, latest=True, return_future=True):
        return ValueWithExpiration(dict(self.entries), time.time() + 30) if key == stage_key(self.run, 1) else None

    async def run_coroutine(self, fn, return_future=True):
        async def list_peers():
            return [PeerInfo(PeerID.from_base58(p), [Multiaddr(a) for a in addrs])
                    for p, addrs in self.connections.items()]
        protocol = SimpleNamespace(record_validator=SwarmRecordValidator(), storage={}, cache={})
        return await fn(self, SimpleNamespace(p2p=SimpleNamespace(list_peers=list_peers), protocol=protocol))


def test_a_reader_skips_unproven_ids_and_ids_over_their_networks_cap(caplog):
    dht = FakeDHT()
    reader = SwarmDHT(dht)
    reader.connections_s = 0.0  # every read asks the (fake) daemon: the connections change between reads here
    asyncio.run(reader.adopt(RUN_SPEC))
    assert (reader.admission.policy.work_bits, reader.ids_per_network) == (BITS, 2)
    victim, early, late = Identity.generate(), [Identity.generate() for _ in range(2)], Identity.generate()
    dht.put(victim, ["/ip4/9.9.9.5/tcp/1"])
    dht.connections[victim.peer_id] = ["/ip4/9.9.9.5/tcp/1"]
    for i, who in enumerate(early):  # an attacker's machine: two ids, both connected from 7.7.7.x
        dht.put(who, [f"/ip4/7.7.7.{i}/tcp/1"])
        dht.connections[who.peer_id] = [f"/ip4/7.7.7.{i}/tcp/1"]
    fakes = [Identity.generate() for _ in range(5)]  # proven ids that claim to sit in the victim's /24
    for i, who in enumerate(fakes):
        dht.put(who, [f"/ip4/9.9.9.{100 + i}/tcp/1"])
    unproven = [Identity.generate() for _ in range(10)]
    for who in unproven:
        dht.put(who, ["/ip4/9.9.9.200/tcp/1"], proven=False)

    async def read() -> set[str]:
        return {a.peer_id for a in await reader.stage_peers(RUN, 1)}

    with caplog.at_level(logging.WARNING, logger="swarm.dht.store"):
        first = asyncio.run(read())
        assert first == {victim.peer_id, *(w.peer_id for w in early), *(w.peer_id for w in fakes)}
        dht.put(late, ["/ip4/9.9.9.6/tcp/1"])  # a third id of the same machine, later, claiming the victim's block
        dht.connections[late.peer_id] = ["/ip4/7.7.7.9/tcp/1"]  # ... but its connection comes from 7.7.7.x
        second = asyncio.run(read())
    assert second == first, "the late id is over its real network's cap; the victim stays"
    skipped = [r.getMessage() for r in caplog.records if "skipped the records of peer" in r.getMessage()]
    assert len(skipped) == 11, "each unproven id and the crowded one logged once, over two reads"
    assert sum("proof of work" in m for m in skipped) == 10 and sum("from its network" in m for m in skipped) == 1
    assert reader.skipped_records == 2 * 10 + 1


def test_a_writer_carries_its_proof_in_every_record_and_cannot_write_without_one():
    dht, me = FakeDHT(), Identity.generate()
    writer = SwarmDHT(dht, me)
    asyncio.run(writer.adopt(RUN_SPEC))
    ann = StageAnnouncement(me.peer_id, RUN, 1, [], 1.0, 0, 0, "online", "0.1.0")
    with pytest.raises(RuntimeError, match="proof of work of 8 bits"):
        asyncio.run(writer.announce(ann, 15))
    writer.work = asyncio.run(proof_for(None, me.peer_id, RUN, BITS))
    assert asyncio.run(writer.announce(ann, 15))
    assert dht.entries[me.peer_id].value["w"] == writer.work.nonce
    reader = SwarmDHT(dht)
    asyncio.run(reader.adopt(RUN_SPEC))  # checks the proof
    assert [a.peer_id for a in asyncio.run(reader.stage_peers(RUN, 1))] == [me.peer_id]
    assert reader.skipped_records == 0


BLOCK_SPEC = sealed_spec(preset("tiny", stages=2), SigningKey.generate(), id_work_bits=8, ids_per_network=2,
                         ids_per_block=3)


def test_a_reader_keeps_the_ids_of_a_block_it_saw_first_and_skips_the_rest(caplog):
    dht = FakeDHT(BLOCK_SPEC.run_hash)
    reader = SwarmDHT(dht)
    reader.connections_s = 0.0
    asyncio.run(reader.adopt(BLOCK_SPEC))
    assert (reader.ids_per_network, reader.ids_per_block) == (2, 3)

    def connect(who: Identity, maddr: str) -> None:
        dht.put(who, [maddr])
        dht.connections[who.peer_id] = [maddr]
    honest = [Identity.generate() for _ in range(2)]
    connect(honest[0], "/ip6/2003:e1:1::5/tcp/1")
    connect(honest[1], "/ip4/9.9.9.5/tcp/1")
    early = [Identity.generate() for _ in range(3)]  # one id in each of three /48s of the attacker's /32
    for i, who in enumerate(early):
        connect(who, f"/ip6/2001:470:{i + 1:x}::1/tcp/1")

    async def read() -> set[str]:
        return {a.peer_id for a in await reader.stage_peers(BLOCK_SPEC.run_hash, 1)}
    with caplog.at_level(logging.WARNING, logger="swarm.dht.store"):
        first = asyncio.run(read())
        assert first == {w.peer_id for w in honest + early}
        late = [Identity.generate() for _ in range(5)]  # five more /48s of the same /32, later
        for i, who in enumerate(late):
            connect(who, f"/ip6/2001:470:{100 + i:x}::1/tcp/1")
        second = asyncio.run(read())
    assert second == first, "the block already holds 3 ids: the late ones are skipped, the honest ones stay"
    skipped = [r.getMessage() for r in caplog.records if "skipped the records of peer" in r.getMessage()]
    assert len(skipped) == 5 and all("its block" in m and "3 per /16 or /32" in m for m in skipped)

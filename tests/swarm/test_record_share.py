"""Re-served records (kind `rec`, swarm/dht/record_share.py, held.py): what a peer believes of another peer's copy
of the run spec, the leader lease and the basis chain (only what the swarm key signed, and for the spec only the
pinned key's), how a reader treats a peer's lease (only when the DHT has none, never over a higher term), and what
a server refuses (a malformed or oversize request, a stranger of a private swarm) with one sentence."""
from __future__ import annotations

import dataclasses

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.basis_update import BasisUpdate, encode_update
from protocol.record_wire import (
    MAX_REQUEST_BYTES,
    RecordRequest,
    decode_record_reply,
    decode_record_request,
    encode_record_request,
)
from protocol.spec import preset
from protocol.wire import WireError
from swarm.basis.sync import BasisSync
from swarm.coordinator.options import sealed_spec
from swarm.data.tokenizer_fetch import admits
from swarm.dht import Envelope, LeaderLease, RecordError, SwarmDHT, lease_key
from swarm.dht import store as store_module
from swarm.dht.held import HeldRecords, lease_from_peer
from swarm.dht.record_service import initial_ids
from swarm.dht.record_share import PeerRecords, RecordShare
from swarm.node import JoinError, fetch_spec
from swarm.trust.admission import Admission, AdmissionPolicy, Ticket
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.swarm.memory_dht import Clock, MemoryDHT

SPEC = preset("tiny", stages=2, codec="subspace", basis_interval=5)
BASIS = SPEC.d_model * SPEC.rank * 4 + 4096


def _asking(*shares: RecordShare, sender: str = "newcomer", ticket: bytes = b"") -> PeerRecords:
    async def request(peer: str, _kind: str, body: bytes, _timeout: float) -> bytes:
        return await shares[int(peer)].on_request(body, sender)

    async def candidates() -> list[str]:
        return [str(i) for i in range(len(shares))]
    return PeerRecords(request, candidates, ticket, basis_bytes=BASIS, every_s=0.0)


def _held(key: SigningKey, term: int = 3, spec=None) -> HeldRecords:
    """What a peer of a run holds: its signed spec, and a lease `term` sealed as the coordinator seals one."""
    from swarm.dht.records import SignedRunSpec
    spec = spec or sealed_spec(SPEC, key)
    held = HeldRecords()
    held.spec = SignedRunSpec.create(spec.to_json(), key)
    lease = LeaderLease(spec.run_hash, term, ["head-a", "head-b"])
    env = Envelope.seal(lease_key(spec.run_hash), key.fingerprint(), lease.to_record(), 1.0, Identity.of_key(key))
    held.keep_lease(env, lease)  # expired in 1970: a peer's copy is checked for everything but its expiry
    return held


def _policy(key: SigningKey) -> AdmissionPolicy:
    return AdmissionPolicy(False, key.public_bytes(), "")


async def test_a_peer_s_spec_counts_only_by_the_pinned_key_and_several_unpinned_ones_are_refused():
    key, other = SigningKey.generate(), SigningKey.generate()
    spec = sealed_spec(SPEC, key)
    mine, theirs = RecordShare(_held(key)), RecordShare(_held(other))
    assert (await _asking(mine).run_spec(key.public_bytes())).run_hash == spec.run_hash
    with pytest.raises(RecordError, match="not by the trusted key"):
        await _asking(theirs).run_spec(key.public_bytes())
    assert (await _asking(theirs, mine).run_spec(key.public_bytes())).run_hash == spec.run_hash  # the impostor ignored
    with pytest.raises(RecordError, match="several run specs"):
        await _asking(theirs, mine).run_spec(None)  # unpinned: as the DHT's "several keys"
    forged = _held(key)
    forged.spec = dataclasses.replace(forged.spec, spec_json=forged.spec.spec_json.replace('"tiny"', '"huge"'))
    assert await _asking(RecordShare(forged)).run_spec(None) is None  # its hash rule fails: refused, none taken


async def test_fetch_spec_checks_a_peers_copy_as_it_checks_the_dhts():
    key, other = SigningKey.generate(), SigningKey.generate()
    sdht = SwarmDHT(MemoryDHT(Clock()), Identity.generate())
    with pytest.raises(JoinError, match="not by the pinned"):
        await fetch_spec(sdht, other.fingerprint(), 1.0, _asking(RecordShare(_held(key))))
    with pytest.raises(JoinError, match="or at the peers asked"):
        await fetch_spec(sdht, None, 0.6, _asking(RecordShare(HeldRecords())))  # nobody holds one
    assert sdht.held.spec is None
    spec = await fetch_spec(sdht, None, 1.0, _asking(RecordShare(_held(key))))
    assert sdht.held.spec.run_hash == spec.run_hash  # held, to be re-served


async def test_a_peer_s_lease_counts_only_signed_by_the_swarm_key_for_this_run():
    key = SigningKey.generate()
    run = sealed_spec(SPEC, key).run_hash
    env, lease = _held(key).lease
    data = _held(key).reply("lease", run, 0).record
    assert lease_from_peer(data, run, _policy(key))[1].order == ["head-a", "head-b"]
    with pytest.raises(RecordError, match="not by the swarm key"):
        lease_from_peer(data, run, _policy(SigningKey.generate()))
    with pytest.raises(RecordError, match="another key"):
        lease_from_peer(data, "0" * 16, _policy(key))
    tampered = msgpack.unpackb(data, raw=False)
    tampered["b"] = msgpack.packb(LeaderLease(run, 9, ["stranger"]).to_record())
    with pytest.raises(RecordError, match="does not verify"):
        lease_from_peer(msgpack.packb(tampered), run, _policy(key))
    later = dict(msgpack.unpackb(data, raw=False), x=env.expiration + 10**9)  # a replay with a later expiry
    with pytest.raises(RecordError, match="does not verify"):
        lease_from_peer(msgpack.packb(later), run, _policy(key))
    with pytest.raises(RecordError, match="no coordinator key"):
        lease_from_peer(data, run, AdmissionPolicy())


async def test_a_reader_takes_a_peer_s_lease_only_when_the_dht_has_none_and_never_over_a_higher_term(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(store_module, "get_dht_time", clock)
    key = SigningKey.generate()
    spec = sealed_spec(SPEC, key)
    dht = MemoryDHT(clock)
    coordinator, reader = SwarmDHT(dht, swarm_key=key), SwarmDHT(dht, Identity.generate())
    await reader.adopt(spec)
    reader.record_peers = _asking(RecordShare(_held(key, term=3, spec=spec)))
    await coordinator.publish_lease(LeaderLease(spec.run_hash, 5, ["head-c"]), 60.0)
    assert (await reader.fetch_lease(spec.run_hash)).term == 5  # the DHT's: the peer's term 3 is not even asked
    clock.advance(120)  # the DHT's expired; the reader still holds term 5 and asks nobody
    assert (await reader.fetch_lease(spec.run_hash)).term == 5
    fresh = SwarmDHT(dht, Identity.generate())
    await fresh.adopt(spec)
    fresh.record_peers = _asking(RecordShare(_held(key, term=3, spec=spec)), RecordShare(reader.held))
    assert (await fresh.fetch_lease(spec.run_hash)).term == 5  # of two peers' leases, the higher term
    fresh.held.keep_lease(*_held(key, term=4, spec=spec).lease)
    assert fresh.held.lease[1].term == 5  # a lower term never replaces the one held


async def test_a_peer_s_basis_update_counts_only_if_the_swarm_key_signed_that_version():
    key, other = SigningKey.generate(), SigningKey.generate()
    spec = sealed_spec(SPEC, key)
    held = _held(key, spec=spec)
    U, _ = torch.linalg.qr(torch.randn(spec.d_model, spec.rank, generator=torch.Generator().manual_seed(1)))
    good = BasisUpdate(spec.run_hash, 1, 7, U.contiguous())
    good.signature = key.sign(good.signing_bytes())
    bad = BasisUpdate(spec.run_hash, 2, 12, U.contiguous())
    bad.signature = other.sign(bad.signing_bytes())  # an impostor's version 2
    held.bases = {1: encode_update(good), 2: encode_update(bad), 3: encode_update(good)}  # 3: version 1's bytes
    reader = SwarmDHT(MemoryDHT(Clock()), Identity.generate())
    await reader.adopt(spec)
    reader.record_peers = _asking(RecordShare(held))
    assert [u.version for u in await BasisSync(spec, reader, None)._verified_updates()] == [1]
    assert sorted(reader.held.bases) == [1]  # only what passed is held, and re-served


async def test_the_server_refuses_malformed_requests_and_private_strangers_in_one_sentence():
    key = SigningKey.generate()
    share = RecordShare(_held(key))
    for body, why in [(b"\x92\x01\x02", "not a msgpack map"), (b"x" * (MAX_REQUEST_BYTES + 1), "over the limit"),
                      (msgpack.packb({"k": "rec", "w": "wallet", "r": "", "v": 0}), "one of spec, lease, basis"),
                      (msgpack.packb({"k": "rec", "w": "lease", "r": "", "v": 0}), "names the run"),
                      (msgpack.packb({"k": "rec", "w": "basis", "r": "ab", "v": -1}), "basis version")]:
        with pytest.raises(WireError, match=why):
            decode_record_reply(await share.on_request(body, "anyone"), 1 << 20)
    with pytest.raises(WireError, match="over the limit"):
        decode_record_request(b"x" * (MAX_REQUEST_BYTES + 1))

    class PrivateView:  # a private swarm's DHT view that has read no announcement of the asker
        admission = Admission(AdmissionPolicy(True, key.public_bytes(), "12D3KooWCoordinator"))

        async def admitted(self, peer: str) -> bool:
            return False
    private = RecordShare(_held(key), admits(PrivateView()))
    ask = encode_record_request(RecordRequest("spec"))
    with pytest.raises(WireError, match="ticket holders only"):
        decode_record_reply(await private.on_request(ask, "12D3KooWStranger"), 1 << 20)
    ticket = Ticket.issue(key, "12D3KooWNewcomer").to_bytes()
    assert await _asking(private, sender="12D3KooWNewcomer", ticket=ticket).run_spec(key.public_bytes()) is not None


def test_initial_peer_ids_come_from_the_last_p2p_part_of_each_address():
    assert initial_ids(["/ip4/1.2.3.4/tcp/5/p2p/QmA", "/ip4/1.2.3.4/tcp/6/p2p/QmR/p2p-circuit/p2p/QmB",
                        "/ip4/1.2.3.4/tcp/5/p2p/QmA"]) == ["QmA", "QmB"]


_FUZZED = RecordShare(_held(SigningKey.generate()))  # a peer that holds a spec and a lease
_INT = st.integers(-2**63, 2**64 - 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(st.binary(max_size=2048), st.dictionaries(st.sampled_from(["k", "w", "r", "v", "t", "x"]),
                                                                st.one_of(st.none(), st.booleans(), _INT,
                                                                          st.text(max_size=40), st.binary(max_size=40),
                                                                          st.lists(_INT, max_size=4)))
                                .map(lambda d: msgpack.packb({"k": "rec", **d}))))
async def test_no_request_escapes_the_handler_and_every_reply_is_a_record_or_one_sentence(body):
    reply = await _FUZZED.on_request(body, "anyone")
    try:
        decode_record_reply(reply, 1 << 20)
    except WireError as e:
        assert str(e).startswith("the peer refused: ")

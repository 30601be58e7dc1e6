"""Health records: signing by the peer's libp2p identity, verification, and the dashboard's HealthBook (no network)."""
from __future__ import annotations

import math
from dataclasses import asdict, replace

import msgpack
import pytest

from swarm.dashboard.book import HealthBook
from swarm.dht import Envelope, RecordError, health_key
from swarm.monitor.health import MAX_BANNED, HealthRecord, parse_health, reachability_of
from swarm.trust.admission import AdmissionPolicy, Ticket
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey

RUN = "a75f7a22fb141ca3"
ALICE, BOB = Identity.generate(), Identity.generate()
NOW, EXPIRES = 1001.0, 1015.0  # DHT time of the checks, and the records' expiry


def record(peer_id: str = ALICE.peer_id, **overrides) -> HealthRecord:
    base = dict(
        peer_id=peer_id, run_hash=RUN, stage=1, state="online", step=42, tokens_per_s=5000.0, queue=1, loss=3.25,
        loss_history=[[41, 3.3, 1000.0], [42, 3.25, 1001.0]], bytes_in_per_s=4e5, bytes_out_per_s=4.1e5,
        bytes_in=10**7, bytes_out=10**7 + 5, act_bytes_out=65_000, act_tokens_out=1000, grad_bytes_out=64_000,
        grad_tokens_out=1000, codec="subspace", rank=16, basis_version=2, basis_updated_step=40, device="cpu",
        memory_bytes=450 * 2**20, peak_memory_bytes=600 * 2**20, uptime_s=12.5, reachability="direct",
        version="0.1.0", refused=0,
        banned={"12D3KooWGone": 2}, timestamp=1000.0,
    )
    return HealthRecord(**{**base, **overrides})


def signed_value(rec: HealthRecord | dict, signer: Identity = ALICE, expires: float = EXPIRES,
                 subkey: str | None = None, ticket: bytes = b"") -> dict:
    body = asdict(rec) if isinstance(rec, HealthRecord) else rec
    subkey = subkey or signer.peer_id
    return Envelope.seal(health_key(RUN), subkey, body, expires, signer, ticket).to_value()


def parse(value: dict, subkey: str = ALICE.peer_id, expires: float = EXPIRES, policy=None):
    return parse_health(subkey, value, expires, policy, now=NOW)


def test_a_signed_record_round_trips_and_derives_bytes_per_token():
    got = parse(signed_value(record()))
    assert got.record == record() and got.public_key == ALICE.public_proto
    assert got.record.forward_bytes_per_token == 65.0 and got.record.backward_bytes_per_token == 64.0
    assert record(act_tokens_out=0).forward_bytes_per_token is None
    assert record().sync_bytes_per_step is None  # no step taken with another replica yet
    synced = parse(signed_value(record(sync_bytes_out=9000, sync_steps=3))).record
    assert synced.sync_bytes_out == 9000 and synced.sync_bytes_per_step == 3000.0
    assert got.record.peak_memory_bytes == 600 * 2**20


@pytest.mark.parametrize("field,value", [("step", 999999), ("loss", 0.1), ("state", "leaving"),
                                         ("banned", {}), ("loss_history", [])])
def test_any_changed_field_breaks_the_signature(field, value):
    value_ = signed_value(record())
    value_["b"] = msgpack.packb(asdict(record()) | {field: value}, use_bin_type=True)
    with pytest.raises(RecordError, match="does not verify"):
        parse(value_)


def test_a_record_signed_by_another_key_than_it_carries_is_refused():
    value = signed_value(record(), signer=BOB, subkey=ALICE.peer_id)
    with pytest.raises(RecordError, match="signed by another peer"):  # Bob's key does not hash to Alice's id
        parse(value)
    value["p"] = ALICE.public_proto  # ... and claiming Alice's key, Bob's signature does not verify
    with pytest.raises(RecordError, match="does not verify"):
        parse(value)


def test_a_record_filed_under_another_peer_is_refused():
    with pytest.raises(RecordError, match="another peer's id"):  # Alice's envelope, Bob's name inside
        parse(signed_value(record(peer_id=BOB.peer_id)))
    with pytest.raises(RecordError, match="does not verify"):  # Alice's envelope moved under Bob's subkey
        parse(signed_value(record()), subkey=BOB.peer_id)


def test_a_record_cannot_be_replayed_to_live_longer_or_claim_a_far_expiry():
    with pytest.raises(RecordError, match="does not verify"):
        parse(signed_value(record()), expires=EXPIRES + 60)  # the signature covers the expiry
    with pytest.raises(RecordError, match="longer than"):
        parse(signed_value(record(), expires=NOW + 10_000), expires=NOW + 10_000)


@pytest.mark.parametrize("mangle", [
    lambda v: {k: x for k, x in v.items() if k != "step"},
    lambda v: {**v, "stage": -1},
    lambda v: {**v, "stage": True},
    lambda v: {**v, "tokens_per_s": math.inf},
    lambda v: {**v, "state": "hacked"},
    lambda v: {**v, "peer_id": "x" * 1000},
    lambda v: {**v, "banned": {f"p{i}": 1 for i in range(MAX_BANNED + 1)}},
    lambda v: {**v, "loss_history": [[1, "nan", 2.0]]},
    lambda v: {**v, "banned": {"p": [1]}},
    lambda v: {**v, "sync_bytes_out": -1},
    lambda v: {**v, "sync_steps": 1.5},
    lambda v: {**v, "peak_memory_bytes": -1},
    lambda v: {k: x for k, x in v.items() if k != "peak_memory_bytes"},
    lambda v: "not a map",
])
def test_malformed_records_signed_by_their_owner_are_refused_with_a_record_error(mangle):
    with pytest.raises(RecordError):
        parse(signed_value(mangle(asdict(record()))))


@pytest.mark.parametrize("mangle", [
    lambda v: "not a map",
    lambda v: {**v, "s": b"short"},
    lambda v: {**v, "s": None},
    lambda v: {**v, "p": None},
    lambda v: {**v, "p": b"\x08\x01\x12\x20" + bytes(31)},
    lambda v: {k: x for k, x in v.items() if k != "b"},
    lambda v: {**v, "k": "subspace-swarm/run"},
])
def test_malformed_envelopes_are_refused_with_a_record_error(mangle):
    with pytest.raises(RecordError):
        parse(mangle(signed_value(record())))


def test_records_refuse_non_finite_numbers_when_built():
    with pytest.raises(RecordError, match="loss"):
        record(loss=math.nan)
    assert record(loss=None).loss is None


def test_reachability_is_relayed_only_when_every_address_is_a_circuit():
    assert reachability_of(["/ip4/127.0.0.1/tcp/1"]) == "direct"
    assert reachability_of(["/ip4/1.2.3.4/tcp/1/p2p/QmRelay/p2p-circuit"]) == "relayed"
    assert reachability_of(["/ip4/1.2.3.4/tcp/1/p2p/QmRelay/p2p-circuit", "/ip4/5.6.7.8/tcp/2"]) == "direct"


def test_the_book_refuses_forgeries_and_counts_each_bad_entry_once():
    book = HealthBook(RUN)
    book.update([(ALICE.peer_id, signed_value(record()), EXPIRES)], now=NOW)
    assert book.live()[ALICE.peer_id].record.step == 42
    assert book.key_of(ALICE.peer_id) == book.live()[ALICE.peer_id].fingerprint

    forged = signed_value(record(step=999999, timestamp=1002.0), signer=BOB, subkey=ALICE.peer_id,
                          expires=EXPIRES + 1)
    junk = ("12D3KooWJunk", "not a record", EXPIRES)
    other_run = (BOB.peer_id, signed_value(record(BOB.peer_id, run_hash="0" * 16), signer=BOB), EXPIRES)
    for now in (1002.0, 1003.0, 1004.0):  # the same bad entries, read on every poll
        book.update([(ALICE.peer_id, forged, EXPIRES + 1), junk, other_run], now=now)
    assert book.invalid == 3
    assert book.live()[ALICE.peer_id].record.step == 42, "a forged record replaced the honest one"
    assert any("signed by another peer" in p for p in book.problems)

    # Alice's record expires: a forgery still cannot take her id (no first-come pinning to win)
    book.update([(ALICE.peer_id, forged, EXPIRES + 1)], now=EXPIRES + 0.5)
    assert ALICE.peer_id not in book.live() and book.invalid == 3
    # Alice herself, restarted with the same identity, is accepted at once
    later = signed_value(record(step=50, timestamp=1016.0), expires=1031.0)
    book.update([(ALICE.peer_id, later, 1031.0)], now=1016.0)
    assert book.live()[ALICE.peer_id].record.step == 50


def test_the_book_keeps_the_newest_record_of_a_peer():
    book = HealthBook(RUN)
    book.update([(ALICE.peer_id, signed_value(record(step=50, timestamp=1010.0), expires=1025.0), 1025.0)],
                now=1010.0)
    book.update([(ALICE.peer_id, signed_value(replace(record(step=40), timestamp=1000.0), expires=1026.0), 1026.0)],
                now=1011.0)
    assert book.live()[ALICE.peer_id].record.step == 50 and book.invalid == 0


def test_the_book_of_a_private_swarm_takes_only_admitted_peers():
    swarm_key = SigningKey.generate()
    policy = AdmissionPolicy(private=True, swarm_key=swarm_key.public_bytes())
    ticket = Ticket.issue(swarm_key, ALICE.peer_id, expires=2000.0).to_bytes()
    stranger_ticket = Ticket.issue(SigningKey.generate(), BOB.peer_id, expires=2000.0).to_bytes()
    book = HealthBook(RUN, policy)
    book.update([(ALICE.peer_id, signed_value(record(), ticket=ticket), EXPIRES),
                 (BOB.peer_id, signed_value(record(BOB.peer_id), signer=BOB), EXPIRES),
                 (BOB.peer_id, signed_value(record(BOB.peer_id, step=7), signer=BOB, ticket=stranger_ticket),
                  EXPIRES)], now=NOW)
    assert set(book.live()) == {ALICE.peer_id} and book.invalid == 2
    assert any("has no ticket" in p for p in book.problems) and any("not this swarm's" in p for p in book.problems)

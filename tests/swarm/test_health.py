"""Health records: signing, verification, and the dashboard's HealthBook (no network)."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from swarm.dashboard.book import HealthBook
from swarm.dht import RecordError
from swarm.keys import SigningKey
from swarm.monitor.health import MAX_BANNED, HealthRecord, SignedHealth, parse_health, reachability_of

RUN = "a75f7a22fb141ca3"


def record(peer_id: str = "12D3KooWPeerA", **overrides) -> HealthRecord:
    base = dict(
        peer_id=peer_id, run_hash=RUN, stage=1, state="online", step=42, tokens_per_s=5000.0, queue=1, loss=3.25,
        loss_history=[[41, 3.3, 1000.0], [42, 3.25, 1001.0]], bytes_in_per_s=4e5, bytes_out_per_s=4.1e5,
        bytes_in=10**7, bytes_out=10**7 + 5, act_bytes_out=65_000, act_tokens_out=1000, grad_bytes_out=64_000,
        grad_tokens_out=1000, codec="subspace", rank=16, basis_version=2, basis_updated_step=40, device="cpu",
        memory_bytes=450 * 2**20, uptime_s=12.5, reachability="direct", version="0.1.0", refused=0,
        banned={"12D3KooWGone": 2}, timestamp=1000.0,
    )
    return HealthRecord(**{**base, **overrides})


def signed_value(rec: HealthRecord, key: SigningKey) -> dict:
    return SignedHealth.create(rec, key).to_value()


def test_a_signed_record_round_trips_and_derives_bytes_per_token():
    key = SigningKey.generate()
    got = parse_health("12D3KooWPeerA", signed_value(record(), key))
    assert got.record == record() and got.public_key == key.public_bytes()
    assert got.record.forward_bytes_per_token == 65.0 and got.record.backward_bytes_per_token == 64.0
    assert record(act_tokens_out=0).forward_bytes_per_token is None


@pytest.mark.parametrize("field,value", [("step", 999999), ("loss", 0.1), ("state", "leaving"),
                                         ("banned", {}), ("loss_history", [])])
def test_any_changed_field_breaks_the_signature(field, value):
    value_ = signed_value(record(), SigningKey.generate())
    value_[field] = value
    with pytest.raises(RecordError, match="does not verify"):
        parse_health("12D3KooWPeerA", value_)


def test_a_record_signed_by_another_key_than_it_carries_is_refused():
    honest, forger = SigningKey.generate(), SigningKey.generate()
    value = signed_value(record(), forger)
    value["public_key"] = honest.public_bytes()  # claims to be the honest peer's record
    with pytest.raises(RecordError, match="does not verify"):
        parse_health("12D3KooWPeerA", value)


def test_a_record_filed_under_another_peer_is_refused():
    with pytest.raises(RecordError, match="another peer's id"):
        parse_health("12D3KooWSomeoneElse", signed_value(record(), SigningKey.generate()))


@pytest.mark.parametrize("mangle", [
    lambda v: "not a map",
    lambda v: {k: x for k, x in v.items() if k != "step"},
    lambda v: {**v, "signature": b"short"},
    lambda v: {**v, "public_key": None},
    lambda v: {**v, "stage": -1},
    lambda v: {**v, "stage": True},
    lambda v: {**v, "tokens_per_s": math.inf},
    lambda v: {**v, "state": "hacked"},
    lambda v: {**v, "peer_id": "x" * 1000},
    lambda v: {**v, "banned": {f"p{i}": 1 for i in range(MAX_BANNED + 1)}},
    lambda v: {**v, "loss_history": [[1, "nan", 2.0]]},
    lambda v: {**v, "banned": {"p": [1]}},
])
def test_malformed_records_are_refused_with_a_record_error(mangle):
    with pytest.raises(RecordError):
        parse_health("12D3KooWPeerA", mangle(signed_value(record(), SigningKey.generate())))


def test_records_refuse_non_finite_numbers_when_built():
    with pytest.raises(RecordError, match="loss"):
        record(loss=math.nan)
    assert record(loss=None).loss is None


def test_reachability_is_relayed_only_when_every_address_is_a_circuit():
    assert reachability_of(["/ip4/127.0.0.1/tcp/1"]) == "direct"
    assert reachability_of(["/ip4/1.2.3.4/tcp/1/p2p/QmRelay/p2p-circuit"]) == "relayed"
    assert reachability_of(["/ip4/1.2.3.4/tcp/1/p2p/QmRelay/p2p-circuit", "/ip4/5.6.7.8/tcp/2"]) == "direct"


def test_the_book_pins_the_first_key_and_counts_each_bad_entry_once():
    honest, forger = SigningKey.generate(), SigningKey.generate()
    book = HealthBook(RUN)
    book.update([("12D3KooWPeerA", signed_value(record(), honest), 1015.0)], now=1001.0)
    assert book.live()["12D3KooWPeerA"].record.step == 42

    forged = signed_value(record(step=999999, timestamp=1002.0), forger)
    junk = ("12D3KooWJunk", "not a record", 1015.0)
    other_run = ("12D3KooWPeerB", signed_value(record("12D3KooWPeerB", run_hash="0" * 16), honest), 1015.0)
    for now in (1002.0, 1003.0, 1004.0):  # the same bad entries, read on every poll
        book.update([("12D3KooWPeerA", forged, 1016.0), junk, other_run], now=now)
    assert book.invalid == 3
    assert book.live()["12D3KooWPeerA"].record.step == 42, "a forged record replaced the pinned one"
    assert any("signed by key" in p for p in book.problems)

    # the honest record expires: the pin goes with it, but the entry judged forged stays refused
    book.update([("12D3KooWPeerA", forged, 1016.0)], now=1015.5)
    assert "12D3KooWPeerA" not in book.live() and book.invalid == 3
    # a restarted peer (same id, new process key) is accepted once its old record is gone
    restarted = SigningKey.generate()
    book.update([("12D3KooWPeerA", signed_value(record(step=50, timestamp=1016.0), restarted), 1031.0)], now=1016.0)
    assert book.live()["12D3KooWPeerA"].record.step == 50


def test_the_book_keeps_the_newest_record_of_a_peer():
    key = SigningKey.generate()
    book = HealthBook(RUN)
    book.update([("12D3KooWPeerA", signed_value(record(step=50, timestamp=1010.0), key), 1025.0)], now=1010.0)
    book.update([("12D3KooWPeerA", signed_value(replace(record(step=40), timestamp=1000.0), key), 1026.0)],
                now=1011.0)
    assert book.live()["12D3KooWPeerA"].record.step == 50 and book.invalid == 0

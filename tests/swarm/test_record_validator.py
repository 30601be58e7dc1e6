"""`SwarmRecordValidator` on records exactly as a hivemind node hands them over (no network)."""
from __future__ import annotations

import dataclasses
import pickle
import time

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer

from swarm.dht import (
    CLOCK_SKEW_S,
    RUN_KEY,
    Envelope,
    SignedRunSpec,
    StageAnnouncement,
    SwarmRecordValidator,
    basis_key,
    basis_subkey,
    health_key,
    stage_key,
)
from swarm.dht.validator import in_lookup
from swarm.trust.admission import AdmissionPolicy, Ticket
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey

RUN = "0123456789abcdef"
KEY = stage_key(RUN, 1)
PEER, ATTACKER = Identity.generate(), Identity.generate()
SWARM, IMPOSTOR = SigningKey.generate(), SigningKey.generate()


def announcement(peer: Identity, **changes) -> dict:
    ann = StageAnnouncement(peer.peer_id, RUN, 1, ["/ip4/127.0.0.1/tcp/1"], 100.0, 0, 0, "online", "0.1.0")
    return dataclasses.replace(ann, **changes).to_record()


def sealed(peer: Identity = PEER, key: str = KEY, subkey: str | None = None, ttl: float = 15.0,
           body: object = None, ticket: bytes = b"") -> Envelope:
    body = announcement(peer) if body is None else body
    return Envelope.seal(key, subkey or peer.peer_id, body, time.time() + ttl, peer, ticket)


def as_stored(env: Envelope, value: object = None, expiration: float | None = None, key: str | None = None,
              subkey: object = None) -> DHTRecord:
    """What a hivemind node passes to validate(): the key's DHTID, msgpack'd subkey and value, the expiry."""
    return DHTRecord(DHTID.generate(source=key or env.key).to_bytes(),
                     MSGPackSerializer.dumps(env.subkey if subkey is None else subkey),
                     MSGPackSerializer.dumps(env.to_value() if value is None else value),
                     env.expiration if expiration is None else expiration)


def refused(record: DHTRecord, policy: AdmissionPolicy | None = None, reason: str = "") -> bool:
    validator = SwarmRecordValidator(policy)
    ok = validator.validate(record)
    assert ok or reason in validator.reasons[-1], f"refused, but for {validator.reasons[-1]!r}"
    assert validator.refused == (0 if ok else 1)
    return not ok


def test_a_record_signed_by_the_peer_it_is_filed_under_is_accepted():
    assert not refused(as_stored(sealed()))
    assert not refused(as_stored(sealed(key=health_key(RUN), body={"any": "health"})))


def test_a_record_signed_by_another_key_than_its_subkey_is_refused():
    forged = sealed(ATTACKER, subkey=PEER.peer_id, body=announcement(PEER, throughput=1e12))
    assert refused(as_stored(forged), reason="signed by another peer")
    claims_key = {**forged.to_value(), "p": PEER.public_proto}  # carrying the victim's key instead
    assert refused(as_stored(forged, value=claims_key), reason="does not verify")


def test_a_tampered_value_is_refused():
    env = sealed()
    tampered = dataclasses.replace(env, body=Envelope.seal(KEY, PEER.peer_id, announcement(PEER, throughput=1e12),
                                                           env.expiration, PEER).body)
    assert refused(as_stored(tampered), reason="does not verify")


def test_a_replay_with_a_later_expiry_is_refused():
    env = sealed()
    assert refused(as_stored(env, expiration=env.expiration + 30), reason="does not verify")


def test_a_far_expiry_is_refused_even_when_signed_by_the_owner():
    assert refused(as_stored(sealed(ttl=3600)), reason="longer than")
    assert not refused(as_stored(sealed(ttl=300 + CLOCK_SKEW_S - 1)))  # within max_ttl and the clock slack


def test_a_record_moved_to_another_key_or_subkey_is_refused():
    env = sealed()
    assert refused(as_stored(env, key=stage_key(RUN, 2)), reason="filed under another")
    assert refused(as_stored(env, subkey=ATTACKER.peer_id), reason="does not verify")


@pytest.mark.parametrize("value, subkey", [
    ("a plain string", None),
    ({"peer_id": "x"}, None),  # an announcement, but not in an envelope
    (None, None),
    (b"\xff\xfe", None),
])
def test_what_is_not_a_signed_envelope_is_refused(value, subkey):
    env = sealed()
    assert refused(as_stored(env, value=value or "x", subkey=subkey))


def test_plain_values_and_undecodable_bytes_are_refused():
    env = sealed()
    plain = DHTRecord(DHTID.generate(source=KEY).to_bytes(), MSGPackSerializer.dumps(None),
                      MSGPackSerializer.dumps(env.to_value()), env.expiration)
    assert refused(plain, reason="subkey")
    garbage = DHTRecord(DHTID.generate(source=KEY).to_bytes(), b"\xc1", b"\xc1\xc1", env.expiration)
    assert refused(garbage, reason="does not decode")


def test_keys_outside_the_swarm_are_refused():
    assert refused(as_stored(sealed(key="someone-else/free-storage")), reason="not a key of this swarm")
    assert refused(as_stored(sealed(key=f"subspace-swarm/{RUN}/stage/01")), reason="not a key of this swarm")


# ---------------------------------------------------------------------------------------------- private swarms

PRIVATE = AdmissionPolicy(private=True, swarm_key=SWARM.public_bytes())


@pytest.mark.parametrize("ticket, reason", [
    (b"", "has no ticket"),
    (b"junk", "not a ticket"),
    (Ticket.issue(IMPOSTOR, PEER.peer_id).to_bytes(), "not this swarm's"),
    (Ticket.issue(SWARM, ATTACKER.peer_id).to_bytes(), "names peer"),
    (Ticket.issue(SWARM, PEER.peer_id, expires=time.time() + 5).to_bytes(), "expired"),  # before the record does
])
def test_a_private_swarm_refuses_records_without_a_valid_ticket(ticket, reason):
    assert not refused(as_stored(sealed(ticket=ticket)))  # a public swarm does not ask
    assert refused(as_stored(sealed(ticket=ticket)), PRIVATE, reason)


def test_a_private_swarm_accepts_a_ticket_holder_and_the_ticket_cannot_be_stripped():
    env = sealed(ticket=Ticket.issue(SWARM, PEER.peer_id, expires=time.time() + 3600).to_bytes())
    assert not refused(as_stored(env), PRIVATE)
    stripped = {k: v for k, v in env.to_value().items() if k != "t"}
    assert refused(as_stored(env, value=stripped), AdmissionPolicy(), "does not verify")  # the ticket is signed too


# ---------------------------------------------------------------------------------------------- swarm-wide records

def run_spec(key: SigningKey, subkey: str | None = None) -> Envelope:
    record = SignedRunSpec.create('{"a": 1}', key)
    return Envelope.seal(RUN_KEY, subkey or key.fingerprint(), record.to_record(), time.time() + 60,
                         Identity.of_key(key))


def test_run_specs_sit_under_their_signers_fingerprint_and_only_the_swarm_key_once_known():
    pinned = AdmissionPolicy(swarm_key=SWARM.public_bytes())
    assert not refused(as_stored(run_spec(SWARM)), pinned)
    assert not refused(as_stored(run_spec(IMPOSTOR)))  # beside the real one, until the key is known
    assert refused(as_stored(run_spec(IMPOSTOR)), pinned, "not by the swarm key")
    assert refused(as_stored(run_spec(IMPOSTOR, subkey=SWARM.fingerprint())), reason="another key's fingerprint")
    rsa_like = Envelope.seal(RUN_KEY, PEER.peer_id, {}, time.time() + 60, PEER)  # a peer identity is no swarm key
    assert refused(as_stored(rsa_like), reason="another key's fingerprint")


def test_basis_updates_are_filed_by_version_and_signer():
    def update(key: SigningKey, subkey: object) -> Envelope:
        return Envelope.seal(basis_key(RUN), subkey, b"update bytes", time.time() + 6000, Identity.of_key(key))

    pinned = AdmissionPolicy(swarm_key=SWARM.public_bytes())
    assert not refused(as_stored(update(SWARM, basis_subkey(3, SWARM.fingerprint()))), pinned)
    assert refused(as_stored(update(IMPOSTOR, basis_subkey(3, SWARM.fingerprint()))), reason="its signer's")
    assert refused(as_stored(update(IMPOSTOR, basis_subkey(3, IMPOSTOR.fingerprint()))), pinned, "not by the swarm")
    assert refused(as_stored(update(SWARM, "3")), reason="its signer's")
    assert refused(as_stored(update(SWARM, basis_subkey(3, SWARM.fingerprint())), subkey=3), reason="subkey")


def test_the_validator_survives_pickling_into_the_dht_process():
    validator = pickle.loads(pickle.dumps(SwarmRecordValidator(PRIVATE)))
    assert validator.policy == PRIVATE
    assert not validator.validate(as_stored(sealed()))
    assert validator.refused == 1 and "has no ticket" in validator.reasons[-1]


def test_a_remembered_acceptance_does_not_outlive_a_change_of_rule():
    validator, record = SwarmRecordValidator(), as_stored(sealed())
    assert validator.validate(record) and validator.validate(record)  # the second time from memory
    validator.set_policy(PRIVATE)
    assert not validator.validate(record) and "has no ticket" in validator.reasons[-1]


def test_lookup_replies_are_checked_without_the_clock_but_never_remembered_as_stored():
    validator = SwarmRecordValidator()
    far, forged = as_stored(sealed(ttl=3600)), as_stored(sealed(ATTACKER, subkey=PEER.peer_id))
    token = in_lookup.set(True)
    try:
        assert validator.validate(far)  # the one clock-dependent rule is left to readers, entry by entry
        assert not validator.validate(forged)  # every other rule holds in replies too
    finally:
        in_lookup.reset(token)
    assert not validator.validate(far) and "longer than" in validator.reasons[-1]  # a store is still refused

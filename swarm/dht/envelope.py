"""Signed envelopes: every value the swarm stores in the DHT, and the one check of who may write it.

A record is stored as the map {"k": key, "b": body, "p": signer, "s": signature, "t": ticket}:
`body` is the msgpack of the record itself (a StageAnnouncement, a HealthRecord, ...),
`signer` the writer's libp2p public key (protobuf-encoded, `swarm/trust/identity.py`), `ticket`
its admission ticket in a private swarm (else absent). The signature is

    sign(msgpack([RECORD_DOMAIN, key, subkey, body, expiration_time, ticket]))

so a record cannot be moved to another key or subkey, altered, or replayed with a later
expiry; the DHT's own expiration time is part of what is signed.

`check_envelope` is the whole rule, run both by every honest DHT node (`validator.py`, so a
refused record is never stored nor passed on; rule 2 only on stores, see there) and again by
readers (`store.py`, because a hostile node answers a lookup with whatever it likes):

1. the key is one of the swarm's (`records.KEY_KINDS`) and the key the DHT filed it under;
2. its expiry is at most now + the kind's max_ttl + CLOCK_SKEW_S, so nobody can lock a subkey;
3. the signature verifies against `signer`;
4. `signer` owns the subkey: peer records are filed under peer_id_of(signer); swarm-wide
   records under that key's fingerprint, and only the swarm key's once it is known;
5. in a private swarm, a peer record carries a ticket for its peer id valid until the
   record expires (`swarm/trust/admission.py`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import msgpack

from swarm.trust.admission import AdmissionError, AdmissionPolicy
from swarm.trust.identity import Identity, ed25519_public_key, peer_id_of, verify_by
from swarm.trust.keys import fingerprint_of

from .records import KeyKind, RecordError, _require, kind_of, parse_basis_subkey

__all__ = ["CLOCK_SKEW_S", "RECORD_DOMAIN", "Envelope", "check_envelope"]

RECORD_DOMAIN = "subspace-swarm/record/v1"
CLOCK_SKEW_S = 60.0  # how far ahead another node's clock may run without its records being refused


@dataclass(frozen=True)
class Envelope:
    key: str
    subkey: str
    body: bytes  # msgpack of the record
    expiration: float
    signer: bytes  # libp2p-encoded public key
    signature: bytes
    ticket: bytes = b""

    def signing_bytes(self) -> bytes:
        return msgpack.packb([RECORD_DOMAIN, self.key, self.subkey, self.body, float(self.expiration), self.ticket],
                             use_bin_type=True)

    @classmethod
    def seal(cls, key: str, subkey: str, record: object, expiration: float, signer: Identity,
             ticket: bytes = b"") -> Envelope:
        unsigned = cls(key, subkey, msgpack.packb(record, use_bin_type=True), float(expiration), signer.public_proto,
                       b"", ticket)
        return dataclasses.replace(unsigned, signature=signer.sign(unsigned.signing_bytes()))

    def to_value(self) -> dict:
        value = {"k": self.key, "b": self.body, "p": self.signer, "s": self.signature}
        if self.ticket:
            value["t"] = self.ticket
        return value

    @classmethod
    def from_entry(cls, subkey: object, value: object, expiration: object) -> Envelope:
        """The envelope in one DHT entry, checked for shape only; RecordError if it is none."""
        _require(isinstance(value, dict), f"a swarm record must be a signed envelope, not {type(value).__name__}.")
        key, body, signer, signature, ticket = (value.get(n) for n in ("k", "b", "p", "s", "t"))
        _require(isinstance(key, str), "the record names no key.")
        _require(isinstance(subkey, str) and 0 < len(subkey) <= 128, "the record's subkey is not a short string.")
        _require(isinstance(body, bytes), "the record has no body.")
        _require(isinstance(signer, bytes) and isinstance(signature, bytes), "the record is not signed.")
        _require(ticket is None or isinstance(ticket, bytes), "the record's ticket is not bytes.")
        _require(isinstance(expiration, (int, float)) and not isinstance(expiration, bool)
                 and math.isfinite(expiration), "the record has no finite expiration time.")
        return cls(key, subkey, body, float(expiration), signer, signature, ticket or b"")

    def record(self) -> object:
        """The record itself (msgpack-decoded body); RecordError if it does not decode."""
        try:
            return msgpack.unpackb(self.body, raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
            raise RecordError(f"the record's body does not decode ({type(e).__name__}).") from None


def check_envelope(env: Envelope, now: float, policy: AdmissionPolicy | None = None,
                   bound_expiry: bool = True) -> KeyKind:
    """Raise RecordError unless `env` may stand in the DHT at time `now` (the rules in the module docstring).

    `bound_expiry=False` skips rule 2, the only one that depends on the local clock (see validator.py).
    """
    policy = policy or AdmissionPolicy()
    kind = kind_of(env.key)
    _require(kind is not None, f"{env.key[:80]!r} is not a key of this swarm.")
    _require(not bound_expiry or env.expiration <= now + kind.max_ttl + CLOCK_SKEW_S,
             f"the {kind.name} record of {env.subkey[-8:]} claims to live {env.expiration - now:.0f} s, "
             f"longer than the {kind.max_ttl:.0f} s a {kind.name} record may.")
    _require(verify_by(env.signer, env.signing_bytes(), env.signature),
             f"the {kind.name} record under {env.subkey[-8:]} does not verify against the key it carries.")
    if kind.owner == "peer":
        _require(peer_id_of(env.signer) == env.subkey,
                 f"the {kind.name} record under {env.subkey[-8:]} is signed by another peer "
                 f"({peer_id_of(env.signer)[-8:]}).")
        try:
            policy.check(env.subkey, env.ticket or None, until=env.expiration)
        except AdmissionError as e:
            raise RecordError(str(e)) from None
        return kind
    raw = ed25519_public_key(env.signer)
    _require(raw is not None, f"the {kind.name} record is not signed by an Ed25519 swarm key.")
    fingerprint = fingerprint_of(raw)
    if kind.name in ("run", "lease"):
        _require(env.subkey == fingerprint, f"the {kind.name} record is filed under another key's fingerprint.")
    else:
        parsed = parse_basis_subkey(env.subkey)
        _require(parsed is not None and parsed[1] == fingerprint,
                 "the basis update is not filed under \"{version}:{its signer's fingerprint}\".")
    _require(not policy.swarm_key or raw == policy.swarm_key,
             f"the {kind.name} record is signed by key {fingerprint}, not by the swarm key "
             f"{fingerprint_of(policy.swarm_key) if policy.swarm_key else ''}.")
    return kind

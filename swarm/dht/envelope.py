"""Signed envelopes: every value the swarm stores in the DHT, and the one check of who may write it.

A record is stored as the map {"k": key, "b": body, "p": signer, "s": signature, "t": ticket,
"w": work}: `body` is the msgpack of the record itself (a StageAnnouncement, a HealthRecord, ...),
`signer` the writer's libp2p public key (protobuf-encoded, `swarm/trust/identity.py`), `ticket`
its admission ticket in a private swarm (else absent), `work` the nonce of its proof of work
for its peer id and the run (`swarm/trust/work.py`; absent where the run asks for none). The
signature is

    sign(msgpack([RECORD_DOMAIN, key, subkey, body, expiration_time, ticket]))

so a record cannot be moved to another key or subkey, altered, or replayed with a later
expiry; the DHT's own expiration time is part of what is signed. The proof of work is not
signed: it proves itself (it is bound to the subkey's peer id and the key's run), so a node
that strips or swaps it only gets that copy refused, as withholding the record would; and a
node of an older version, which knows no "w", still checks the signature of a newer record.

`check_envelope` is the whole rule, run both by every honest DHT node (`validator.py`, so a
refused record is never stored nor passed on; rule 2 only on stores, see there) and again by
readers (`store.py`, because a hostile node answers a lookup with whatever it likes):

1. the key is one of the swarm's (`records.KEY_KINDS`) and the key the DHT filed it under;
2. its expiry is at most now + the kind's max_ttl + CLOCK_SKEW_S, so nobody can lock a subkey;
3. the signature verifies against `signer`;
4. `signer` owns the subkey: peer records are filed under peer_id_of(signer); swarm-wide
   records under that key's fingerprint, and only the swarm key's once it is known;
5. in a private swarm, a peer record carries a ticket for its peer id valid until the
   record expires (`swarm/trust/admission.py`);
6. where the run spec asks for `id_work_bits` > 0, a peer record (but the coordinator's) carries
   a proof of that much work for its subkey and the run named in its key; checked before the
   signature (rule 3), since it costs one hash. A record without one (a peer of an older
   version, or an id nobody paid for) is refused.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import msgpack

from swarm.trust.admission import AdmissionError, AdmissionPolicy
from swarm.trust.identity import Identity, ed25519_public_key, peer_id_of, verify_by
from swarm.trust.keys import fingerprint_of
from swarm.trust.work import verify_proof

from .records import KeyKind, RecordError, _require, kind_of, parse_basis_subkey

__all__ = ["CLOCK_SKEW_S", "RECORD_DOMAIN", "Envelope", "WorkMissing", "check_envelope"]

RECORD_DOMAIN = "subspace-swarm/record/v1"
CLOCK_SKEW_S = 60.0  # how far ahead another node's clock may run without its records being refused
_MAX_NONCE = (1 << 64) - 1


class WorkMissing(RecordError):
    """A peer record without a valid proof of work, in a run that asks for one (readers log it once per peer)."""


@dataclass(frozen=True)
class Envelope:
    key: str
    subkey: str
    body: bytes  # msgpack of the record
    expiration: float
    signer: bytes  # libp2p-encoded public key
    signature: bytes
    ticket: bytes = b""
    work: int | None = None  # proof-of-work nonce (unsigned: see the module docstring)

    def signing_bytes(self) -> bytes:
        return msgpack.packb([RECORD_DOMAIN, self.key, self.subkey, self.body, float(self.expiration), self.ticket],
                             use_bin_type=True)

    @classmethod
    def seal(cls, key: str, subkey: str, record: object, expiration: float, signer: Identity,
             ticket: bytes = b"", work: int | None = None) -> Envelope:
        unsigned = cls(key, subkey, msgpack.packb(record, use_bin_type=True), float(expiration), signer.public_proto,
                       b"", ticket, work)
        return dataclasses.replace(unsigned, signature=signer.sign(unsigned.signing_bytes()))

    def to_value(self) -> dict:
        value = {"k": self.key, "b": self.body, "p": self.signer, "s": self.signature}
        if self.ticket:
            value["t"] = self.ticket
        if self.work is not None:
            value["w"] = self.work
        return value

    @classmethod
    def from_entry(cls, subkey: object, value: object, expiration: object) -> Envelope:
        """The envelope in one DHT entry, checked for shape only; RecordError if it is none."""
        _require(isinstance(value, dict), f"a swarm record must be a signed envelope, not {type(value).__name__}.")
        key, body, signer, signature, ticket, work = (value.get(n) for n in ("k", "b", "p", "s", "t", "w"))
        _require(isinstance(key, str), "the record names no key.")
        _require(isinstance(subkey, str) and 0 < len(subkey) <= 128, "the record's subkey is not a short string.")
        _require(isinstance(body, bytes), "the record has no body.")
        _require(isinstance(signer, bytes) and isinstance(signature, bytes), "the record is not signed.")
        _require(ticket is None or isinstance(ticket, bytes), "the record's ticket is not bytes.")
        _require(work is None or (isinstance(work, int) and not isinstance(work, bool) and 0 <= work <= _MAX_NONCE),
                 "the record's proof of work is not a 64-bit nonce.")
        _require(isinstance(expiration, (int, float)) and not isinstance(expiration, bool)
                 and math.isfinite(expiration), "the record has no finite expiration time.")
        return cls(key, subkey, body, float(expiration), signer, signature, ticket or b"", work)

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
    if kind.owner == "peer" and policy.work_bits and env.subkey != policy.coordinator_peer:
        run_hash = env.key.split("/")[1]  # peer kinds are all subspace-swarm/{run_hash}/...
        if not verify_proof(run_hash, env.subkey, env.work, policy.work_bits):
            raise WorkMissing(f"the {kind.name} record of {env.subkey[-8:]} carries "
                              f"{'no' if env.work is None else 'too little'} proof of work for this run (it asks "
                              f"{policy.work_bits} bits): a peer of an older version, or an id nobody paid for.")
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
    if kind.name in ("run", "lease", "snapshots", "states", "pardons"):
        _require(env.subkey == fingerprint, f"the {kind.name} record is filed under another key's fingerprint.")
    elif kind.name == "coordinator":  # one claim per coordinator: "{fingerprint}:{its peer id}"
        _require(env.subkey.startswith(fingerprint + ":") and len(env.subkey) <= 160,
                 "the coordinator claim is not filed under \"{fingerprint}:{peer id}\".")
    else:
        parsed = parse_basis_subkey(env.subkey)
        _require(parsed is not None and parsed[1] == fingerprint,
                 "the basis update is not filed under \"{version}:{its signer's fingerprint}\".")
    _require(not policy.swarm_key or raw == policy.swarm_key,
             f"the {kind.name} record is signed by key {fingerprint}, not by the swarm key "
             f"{fingerprint_of(policy.swarm_key) if policy.swarm_key else ''}.")
    return kind

"""What a signed DHT record costs, Ed25519 against RSA-2048 identities (docs/security.md, Choices and measurements,
and "Reading, and load"): one stage announcement sealed as a peer seals it (`Envelope.seal`), its size on the wire
(the envelope's msgpack; the bare record's beside it), the time to seal it, the first check of it by a DHT node's
validator (`SwarmRecordValidator.validate`: `check_envelope` and the signature), a repeat (the validator remembers
records it accepted), and a refused record (a copy whose signature is another record's, so the check runs to the
signature and fails). Times are the median and the range over 200 tries, on this machine as loaded as it is.
Usage: python docs/results/envelope_cost.py OUT.json"""
from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time

import msgpack
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from swarm.dht.envelope import Envelope
from swarm.dht.records import StageAnnouncement, stage_key
from swarm.dht.validator import SwarmRecordValidator
from swarm.trust.identity import Identity

TRIES = 200
RUN = "0123456789abcdef"  # a run hash as the swarm writes it


def ms(samples: list[float]) -> dict:
    return {"median_ms": statistics.median(samples) * 1e3, "min_ms": min(samples) * 1e3, "max_ms": max(samples) * 1e3}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def dht_record(env: Envelope) -> DHTRecord:
    return DHTRecord(DHTID.generate(source=env.key).to_bytes(), MSGPackSerializer.dumps(env.subkey),
                     MSGPackSerializer.dumps(env.to_value()), env.expiration)


def measure(identity: Identity) -> dict:
    ann = StageAnnouncement(identity.peer_id, RUN, 1, ["/ip4/203.0.113.7/tcp/31337"], 1234.5, 0, 0, "online",
                            "0.1.0", step=42)
    key, expires = stage_key(RUN, 1), get_dht_time() + 60
    seal, first, repeat, refused = [], [], [], []
    for i in range(TRIES):
        record = dict(ann.to_record(), step=i)  # a new record each time: nothing remembered from the last
        t0 = time.perf_counter()
        env = Envelope.seal(key, identity.peer_id, record, expires, identity)
        seal.append(time.perf_counter() - t0)
        validator = SwarmRecordValidator()
        stored = dht_record(env)
        first.append(timed(lambda v=validator, r=stored: v.validate(r)))
        repeat.append(timed(lambda v=validator, r=stored: v.validate(r)))
        other = Envelope.seal(key, identity.peer_id, dict(record, step=-1), expires, identity)
        forged = dht_record(Envelope(env.key, env.subkey, env.body, env.expiration, env.signer, other.signature))
        refused.append(timed(lambda v=validator, r=forged: v.validate(r)))
        assert validator.refused == 1 and validator.validate(stored)  # the forgery refused, the record not
    return {"envelope_bytes": len(msgpack.packb(env.to_value(), use_bin_type=True)),
            "record_bytes": len(env.body), "seal": ms(seal), "first_check": ms(first), "repeat_check": ms(repeat),
            "refused_check": ms(refused)}


def main(out: str) -> None:
    logging.disable(logging.WARNING)  # the validator logs each forgery it refuses
    rows = {"tries": TRIES, "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0],
            "ed25519": measure(Identity.generate()),
            "rsa2048": measure(Identity(rsa.generate_private_key(public_exponent=65537, key_size=2048)))}
    print(json.dumps(rows, indent=1))
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

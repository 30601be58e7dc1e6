"""Identities that cost: a proof of work bound to one peer id and one run (hashcash).

A libp2p identity is free to make, so in an open swarm one machine could announce thousands
of peer ids. The signed run spec names a cost, `extra["id_work_bits"]` = b (coordinator flag
`--id-work-bits`; 0 or absent: no cost, for LAN swarms), and every peer record (stage
announcement, health record) must carry a nonce n, 0 <= n < 2^64, such that

    sha256(WORK_DOMAIN \\0 run_hash \\0 peer_id \\0 n as 8 big-endian bytes)

has at least b leading zero bits. Finding one takes 2^b hashes on average (a geometric draw:
2^b is the mean, three times it the 95th percentile); checking one takes one hash. Run hashes
(hex) and peer ids (base58) hold no \\0, so no two (run, peer) pairs share a preimage prefix:
a proof is good for its own peer id in its own run only, and costs nothing to check before the
record's signature is.

A peer computes its proof once per (identity, run) and keeps it beside its identity file, in
`<identity file>.work.json` ({run hash: {"peer_id", "bits", "nonce"}}), so a restart does not
redo it. A peer started without --identity gets a new peer id, and so a new proof, each start.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .state_dir import read_json_map

__all__ = ["MAX_BITS", "WORK_DOMAIN", "WorkProof", "find_proof", "leading_zero_bits", "proof_for", "verify_proof",
           "work_digest"]

log = logging.getLogger(__name__)

WORK_DOMAIN = b"subspace-swarm/id-work/v1"
MAX_BITS = 40  # 2^40 hashes is weeks of one core: anything above is a misconfigured run spec
_MAX_NONCE = (1 << 64) - 1
_KEPT_RUNS = 16  # runs remembered per identity file: older ones are dropped when a new one is written


def _prefix(run_hash: str, peer_id: str) -> hashlib._Hash:
    return hashlib.sha256(b"\0".join((WORK_DOMAIN, run_hash.encode(), peer_id.encode(), b"")))


def work_digest(run_hash: str, peer_id: str, nonce: int) -> bytes:
    h = _prefix(run_hash, peer_id)
    h.update(nonce.to_bytes(8, "big"))
    return h.digest()


def leading_zero_bits(digest: bytes) -> int:
    value = int.from_bytes(digest, "big")
    return len(digest) * 8 - value.bit_length()


def verify_proof(run_hash: str, peer_id: str, nonce: object, bits: int) -> bool:
    """One hash: does `nonce` prove `bits` of work for `peer_id` in run `run_hash`?"""
    if bits <= 0:
        return True
    if not isinstance(nonce, int) or isinstance(nonce, bool) or not 0 <= nonce <= _MAX_NONCE:
        return False
    return leading_zero_bits(work_digest(run_hash, peer_id, nonce)) >= bits


def find_proof(run_hash: str, peer_id: str, bits: int, start: int = 0) -> tuple[int, int]:
    """(nonce, hashes tried): the first nonce from `start` on that proves `bits` of work."""
    if not 0 <= bits <= MAX_BITS:
        raise ValueError(f"a proof of work of {bits} bits is out of range (0 to {MAX_BITS}).")
    # a digest proves b bits iff, read as a 256-bit number, it is below 2^(256-b): a bytes compare
    target = (1 << (256 - bits)).to_bytes(33, "big")[1:] if bits else b"\xff" * 32 + b"\x00"
    base = _prefix(run_hash, peer_id)
    nonce = start
    while True:
        h = base.copy()
        h.update(nonce.to_bytes(8, "big"))
        if h.digest() < target:
            return nonce, nonce - start + 1
        nonce += 1


@dataclass(frozen=True)
class WorkProof:
    """A peer's proof for one run, as it rides in the envelope of every record it writes (field "w")."""

    run_hash: str
    peer_id: str
    bits: int
    nonce: int

    def valid(self, run_hash: str, peer_id: str, bits: int) -> bool:
        return (self.run_hash, self.peer_id) == (run_hash, peer_id) and verify_proof(run_hash, peer_id,
                                                                                     self.nonce, bits)


def _proof_file(identity_file: str) -> Path:
    return Path(f"{identity_file}.work.json")


def _kept(identity_file: str | None, run_hash: str, peer_id: str, bits: int) -> WorkProof | None:
    if not identity_file:
        return None
    entry = read_json_map(_proof_file(identity_file)).get(run_hash)
    if not isinstance(entry, dict):
        return None
    proof = WorkProof(run_hash, str(entry.get("peer_id")), bits, entry.get("nonce"))
    return proof if proof.valid(run_hash, peer_id, bits) else None  # another identity's, or too few bits


def _keep(identity_file: str | None, proof: WorkProof) -> None:
    if not identity_file:
        return
    path = _proof_file(identity_file)
    data = read_json_map(path)
    data.pop(proof.run_hash, None)
    data[proof.run_hash] = {"peer_id": proof.peer_id, "bits": proof.bits, "nonce": proof.nonce}
    data = dict(list(data.items())[-_KEPT_RUNS:])  # insertion order: the newest runs stay
    tmp = path.with_name(path.name + ".tmp")
    try:  # written whole, then renamed: never half a file
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # a read-only folder must not stop the peer; a restart only redoes the work
        log.warning("could not keep this peer's proof of work in %s: %s", path, e.strerror)


async def proof_for(identity_file: str | None, peer_id: str, run_hash: str, bits: int) -> WorkProof | None:
    """This peer's proof of `bits` of work for the run: kept beside its identity file, else computed (in a
    thread, with a log line before and after) and kept there. None when the run asks for none."""
    if bits <= 0:
        return None
    kept = _kept(identity_file, run_hash, peer_id, bits)
    if kept is not None:
        log.info("proof of work for run %s: kept from an earlier start (%s)", run_hash, _proof_file(identity_file))
        return kept
    log.info("computing this peer's proof of work for run %s (%d bits: about %.1e hashes, a few CPU-seconds; "
             "once per identity and run)", run_hash, bits, 2.0 ** bits)
    started, cpu = time.monotonic(), time.process_time()
    nonce, hashes = await asyncio.to_thread(find_proof, run_hash, peer_id, bits)
    log.info("proof of work found after %d hashes in %.1f s (%.1f CPU-s of this process)%s", hashes,
             time.monotonic() - started, time.process_time() - cpu,
             f"; kept in {_proof_file(identity_file)}" if identity_file else "")
    proof = WorkProof(run_hash, peer_id, bits, nonce)
    _keep(identity_file, proof)
    return proof

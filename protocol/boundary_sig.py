"""Signed boundary messages (issue 57): every activation and gradient carries its sender's signature.

The sender signs a statement of what it sent, and to whom:

    statement = msgpack([DOMAIN, run hash, step, attempt, microbatch, kind, receiver peer id, digest(body)])
    digest(body) = the first 16 bytes of sha256 of the message's bytes (protocol/spot_check.py `digest`)

with its peer identity key (swarm/trust/boundary_signer.py; in memory: peer/daemon/loopback.py), and the
signature travels in front of the message, in a frame no message can be mistaken for:

    frame = 0xc1 || u16 big-endian signature length || signature || body

(0xc1 is the one byte msgpack never uses, so an unsigned body, which starts with a msgpack map, is
told apart from a signed frame by its first byte.) The receiver validates the body as before, and
refuses a message whose signature is missing or does not verify against the authenticated sender's
key before it accepts it; it keeps the signature and reports it with the digest (`Sent`, kinds "r"
and "q"). So a receiver cannot claim to have got bytes its sender never sent, and a sender that
reports other bytes than it signed has signed two things: the leader, or anyone, can check both
from the reports alone (peer/checks/spot_checks.py).

The signature is opaque here: its form is the signer's (a raw Ed25519 signature in memory; over
libp2p the signer's encoded public key and its signature, so that any peer id's key, RSA too, can be
checked against the id). At most `MAX_SIGNATURE` bytes.
"""
from __future__ import annotations

import struct

import msgpack

DOMAIN = "subspace-swarm/boundary/1"
MAGIC = 0xC1  # never used by msgpack: no message body starts with it
MAX_SIGNATURE = 1024  # an RSA-4096 key's encoding (~550 bytes) and its 512-byte signature fit
HEAD = 3  # the frame's magic byte and u16 signature length
MAX_OVERHEAD = HEAD + MAX_SIGNATURE  # the most a signature frame adds to a message (a receiver's frame limit)


def statement(run: str, step: int, attempt: int, microbatch: int, kind: str, receiver: str, digest: bytes) -> bytes:
    """The bytes a boundary message's sender signs: what it sent (its digest), in which attempt, to whom."""
    return msgpack.packb([DOMAIN, run, int(step), int(attempt), int(microbatch), kind, receiver, bytes(digest)])


def seal(signature: bytes, body: bytes) -> bytes:
    """A body with its sender's signature in front (an empty signature: the body alone, unsigned)."""
    if not signature:
        return bytes(body)
    if len(signature) > MAX_SIGNATURE:
        raise ValueError(f"a boundary signature of {len(signature)} bytes is over {MAX_SIGNATURE}.")
    return bytes([MAGIC]) + struct.pack(">H", len(signature)) + bytes(signature) + bytes(body)


def unseal(frame: bytes) -> tuple[bytes, bytes]:
    """(signature, body) of a frame; b"" for the signature of an unsigned body (or of a cut-off frame,
    which the body's own validation then refuses)."""
    frame = bytes(frame)
    if len(frame) < HEAD or frame[0] != MAGIC:
        return b"", frame
    (n,) = struct.unpack(">H", frame[1:HEAD])
    if n > MAX_SIGNATURE or len(frame) < HEAD + n:
        return b"", frame[HEAD:]
    return frame[HEAD:HEAD + n], frame[HEAD + n:]


__all__ = ["DOMAIN", "MAX_SIGNATURE", "seal", "statement", "unseal"]

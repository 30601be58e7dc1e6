"""`IdentitySigner`: a peer's `Signer` (peer/daemon/interfaces.py) over its libp2p identity (issue 57).

A boundary message's sender signs what it sent (protocol/boundary_sig.py) with the same key p2pd proves on
every connection, so the receiver, the leader and anyone they show the report to can check it against the
sender's peer id alone. The signature carries the signer's encoded public key:

    signature = u16 big-endian length of the key || libp2p public key (protobuf) || signature of the data

and it verifies for `peer_id` only if `peer_id_of(key) == peer_id` (swarm/trust/identity.py) and the
signature checks against that key. An Ed25519 id contains its key, an RSA id is its key's hash: both are
checked the same way. 102 bytes for an Ed25519 identity.
"""
from __future__ import annotations

import struct

from .identity import Identity, peer_id_of, verify_by

__all__ = ["IdentitySigner", "verify_peer"]


def verify_peer(peer_id: str, data: bytes, signature: bytes) -> bool:
    """True only if `signature` (this module's form) is `peer_id`'s over `data`; False for anything else."""
    if not isinstance(signature, bytes) or len(signature) < 2:
        return False
    (n,) = struct.unpack(">H", signature[:2])
    key, sig = signature[2:2 + n], signature[2 + n:]
    if len(key) != n or not sig:
        return False
    try:
        if peer_id_of(key) != peer_id:
            return False
    except Exception:  # bytes off the wire: anything that is not a key is no signature
        return False
    return verify_by(key, data, sig)


class IdentitySigner:
    """Signs with this peer's libp2p identity; checks any peer id's signature."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self._prefix = struct.pack(">H", len(identity.public_proto)) + identity.public_proto

    def sign(self, data: bytes) -> bytes:
        return self._prefix + self.identity.sign(data)

    def verify(self, peer_id: str, data: bytes, signature: bytes) -> bool:
        return verify_peer(peer_id, data, signature)

"""Records a peer signs with its libp2p identity (protocol/step_record.py): the leading head's step
and work records. The record holds the signer's public key; `signed_by_leader` checks that the key
is the one of the peer id the record names as its leader (libp2p: a peer id is its key's hash)
and that the signature verifies, so anyone can check who said it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from protocol.step_record import StepRecord, WorkRecord

from .identity import Identity, peer_id_of, verify_by

R = TypeVar("R", StepRecord, WorkRecord)


def sign_record(identity: Identity) -> Callable[[R], R]:
    """The leading head's signer of its records (a `StepRecord` or a `WorkRecord`)."""
    def sign(record: R) -> R:
        return dataclasses.replace(record, signer=identity.public_proto,
                                   signature=identity.sign(record.signing_bytes()))
    return sign


def signed_by_leader(record: StepRecord | WorkRecord) -> bool:
    try:
        return peer_id_of(record.signer) == record.leader and verify_by(record.signer, record.signing_bytes(),
                                                                        record.signature)
    except Exception:  # a key that does not parse
        return False

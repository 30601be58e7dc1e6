"""Trust: the keys and papers that decide who speaks for the run and who may take part.

- `keys.py`: `SigningKey`, the swarm's Ed25519 key that signs run specs, basis updates and
  tickets, and the one `verify` every reader uses.
- `identity.py`: `Identity`, a node's libp2p identity held in Python so that it can sign the
  records it writes (its peer id is derived from the public key).
- `admission.py`: `AdmissionPolicy` (public swarm, or tickets signed by the swarm key),
  `Ticket`, and `Admission`, a peer's memory of whom it has seen admitted.
- `boundary_signer.py`: `IdentitySigner`, a peer's boundary messages signed with its identity.
- `work.py`: the proof of work a peer id carries in a run that asks for one (`--id-work-bits`).
"""
from .admission import Admission, AdmissionError, AdmissionPolicy, Ticket
from .identity import Identity, IdentityError
from .keys import SigningKey, fingerprint_of, verify

__all__ = [
    "Admission", "AdmissionError", "AdmissionPolicy", "Identity", "IdentityError", "SigningKey", "Ticket",
    "fingerprint_of", "verify",
]

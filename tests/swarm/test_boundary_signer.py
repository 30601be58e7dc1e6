"""`IdentitySigner` (swarm/trust/boundary_signer.py): a peer signs its boundary messages with its libp2p
identity, and anyone checks the signature against the sender's peer id alone (issue 57)."""
from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric import rsa

from peer.checks.boundary_evidence import BY_SIGNATURE, BoundaryEvidence
from protocol.spot_check import Sent
from swarm.replicas.replica import ban_message
from swarm.trust.boundary_signer import IdentitySigner, verify_peer
from swarm.trust.identity import Identity


def test_a_signature_verifies_for_its_signers_peer_id_only_ed25519_and_rsa():
    for identity in (Identity.generate(), Identity(rsa.generate_private_key(public_exponent=65537, key_size=2048))):
        signer, other = IdentitySigner(identity), IdentitySigner(Identity.generate())
        sig = signer.sign(b"statement")
        assert signer.verify(identity.peer_id, b"statement", sig)
        assert other.verify(identity.peer_id, b"statement", sig)  # anyone checks it: the id names the key
        assert not other.verify(other.identity.peer_id, b"statement", sig)  # not as another id's
        assert not verify_peer(identity.peer_id, b"statement!", sig)  # not over other data
        # another key claiming this id, or a forged signature, is refused
        assert not verify_peer(identity.peer_id, b"statement", other.sign(b"statement"))
        assert not verify_peer(identity.peer_id, b"statement", sig[:-1] + bytes([sig[-1] ^ 1]))
    ed = IdentitySigner(Identity.generate())
    assert len(ed.sign(b"x")) == 2 + 36 + 64  # an Ed25519 identity's: 102 bytes a message
    for junk in (b"", b"\x00", b"\xff\xff" + bytes(10), b"\x00\x05abc", None, "text"):
        assert not verify_peer(ed.identity.peer_id, b"x", junk)


def test_a_replica_banned_by_its_senders_signatures_is_told_it_runs_a_modified_peer():
    # the reason as the leader gives it (peer/checks/boundary_evidence.py), and what its owner reads
    evidence = BoundaryEvidence("run", 2, 0, "leader", [("liar", Sent("r", 3, "head", bytes(16), b"forged"))],
                                verify=lambda peer, data, sig: False)
    liar, why = evidence.received("liar", evidence.sent[0][1])
    said = ban_message(why, 2e6)
    assert liar == "liar" and "never signed" in why and BY_SIGNATURE in why
    assert "contradict what their senders signed" in said and "--identity" in said
    assert "computes wrongly" not in said and "Mbit/s" not in said  # neither a GPU fault nor a slow link

"""libp2p identities held in Python: peer ids as p2pd derives them, signatures, identity files."""
from __future__ import annotations

import os
import stat

import pytest
from hivemind.p2p import P2P, PeerID
from hivemind.proto import crypto_pb2

from swarm.dht import start_dht, stop_dht
from swarm.trust.identity import Identity, IdentityError, ed25519_public_key, peer_id_of, public_key_proto, verify_by


def test_an_ed25519_identity_round_trips_and_its_peer_id_holds_its_key():
    identity = Identity.generate()
    assert identity.peer_id.startswith("12D3KooW") and len(identity.public_proto) == 36
    again = Identity.from_bytes(identity.to_bytes())
    assert again.peer_id == identity.peer_id and again.public_proto == identity.public_proto
    assert PeerID.from_base58(identity.peer_id).to_bytes()[2:] == identity.public_proto  # identity multihash
    assert ed25519_public_key(identity.public_proto) is not None


def test_signatures_verify_only_for_the_signer_and_the_data():
    alice, bob = Identity.generate(), Identity.generate()
    sig = alice.sign(b"record")
    assert verify_by(alice.public_proto, b"record", sig)
    assert not verify_by(alice.public_proto, b"recorD", sig)
    assert not verify_by(bob.public_proto, b"record", sig)
    assert not verify_by(alice.public_proto, b"record", sig[:-1] + bytes([sig[-1] ^ 1]))
    for junk in (None, b"", b"\x08\x01", "text", b"\xff" * 2000):
        assert not verify_by(junk, b"record", sig)
    assert not verify_by(alice.public_proto, b"record", None)


def test_a_non_canonical_key_encoding_is_refused():
    identity = Identity.generate()
    raw = ed25519_public_key(identity.public_proto)
    # the same fields, in the other order: it would name another peer id for the same key
    swapped = b"\x12\x20" + raw + b"\x08\x01"
    assert crypto_pb2.PublicKey.FromString(swapped).data == raw
    assert ed25519_public_key(swapped) is None
    assert not verify_by(swapped, b"x", identity.sign(b"x"))


def test_an_rsa_identity_from_hivemind_has_the_peer_id_hivemind_derives(tmp_path):
    path = str(tmp_path / "rsa.key")
    P2P.generate_identity(path)
    with open(path, "rb") as f:
        want = PeerID.from_identity(f.read()).to_base58()
    identity = Identity.load_or_create(path)
    assert identity.peer_id == want and identity.peer_id.startswith("Qm")  # sha2-256 multihash: the key is long
    assert peer_id_of(identity.public_proto) == want and len(identity.public_proto) > 42
    sig = identity.sign(b"record")
    assert verify_by(identity.public_proto, b"record", sig) and not verify_by(identity.public_proto, b"x", sig)
    assert ed25519_public_key(identity.public_proto) is None


def test_identity_files_are_created_private_and_read_back(tmp_path):
    path = tmp_path / "peer.key"
    first = Identity.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Identity.load_or_create(path).peer_id == first.peer_id
    with pytest.raises(IdentityError, match="does not exist"):
        Identity.load_or_create(tmp_path / "missing" / "peer.key")
    (tmp_path / "junk.key").write_bytes(b"\xff\x00not a key")
    with pytest.raises(IdentityError, match="libp2p private key"):
        Identity.load_or_create(tmp_path / "junk.key")
    (tmp_path / "secp.key").write_bytes(crypto_pb2.PrivateKey(key_type=crypto_pb2.Secp256k1,
                                                              data=b"\x01" * 32).SerializeToString())
    with pytest.raises(IdentityError, match="cannot sign with"):
        Identity.load_or_create(tmp_path / "secp.key")
    assert "peer_id=" in repr(first) and "private" not in repr(first).lower()


def test_the_private_temporary_file_holds_the_key_for_p2pd_only(tmp_path):
    identity = Identity.generate()
    path, folder = identity.write_private_file()
    try:
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert Identity.load_or_create(path).peer_id == identity.peer_id
    finally:
        os.remove(path)
        os.rmdir(folder)


def test_peer_ids_of_long_keys_are_hashed():
    long_key = public_key_proto(crypto_pb2.RSA, b"\x01" * 100)
    assert PeerID.from_base58(peer_id_of(long_key)).to_bytes()[:2] == b"\x12\x20"


@pytest.mark.e2e
def test_p2pd_runs_as_the_identity_in_an_rsa_file(tmp_path):
    path = str(tmp_path / "rsa.key")
    P2P.generate_identity(path)
    dht = start_dht([], ["/ip4/127.0.0.1/tcp/0"], path)
    try:
        assert dht.peer_id.to_base58() == Identity.load_or_create(path).peer_id
    finally:
        stop_dht(dht)

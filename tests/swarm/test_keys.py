"""Ed25519 signing keys: round trip, refusals, and the key file on disk."""

from __future__ import annotations

import os
import stat

import pytest

from swarm.trust.keys import SigningKey, fingerprint_of, verify


def test_sign_verify_round_trip():
    key = SigningKey.generate()
    sig = key.sign(b"basis v7")
    assert len(key.public_bytes()) == 32
    assert verify(key.public_bytes(), b"basis v7", sig) is True


def test_tampered_data_and_wrong_key_fail():
    key, other = SigningKey.generate(), SigningKey.generate()
    sig = key.sign(b"basis v7")
    assert verify(key.public_bytes(), b"basis v8", sig) is False
    assert verify(other.public_bytes(), b"basis v7", sig) is False
    flipped = bytes([sig[0] ^ 1]) + sig[1:]
    assert verify(key.public_bytes(), b"basis v7", flipped) is False


@pytest.mark.parametrize(
    "public, data, sig",
    [
        (b"", b"x", b""),
        (b"\xff" * 32, b"x", b"\x00" * 64),
        (b"short", b"x", b"\x00" * 64),
        (None, b"x", b"\x00" * 64),
        ("a string", "text", 12),
        (b"\x00" * 32, b"x", b"\x00" * 63),
        ([1, 2], {}, object()),
    ],
)
def test_garbage_returns_false(public, data, sig):
    assert verify(public, data, sig) is False


def test_fingerprint_is_short_hex_of_public_key():
    key = SigningKey.generate()
    fp = key.fingerprint()
    assert fp == fingerprint_of(key.public_bytes())
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert fp != SigningKey.generate().fingerprint()
    assert fp in repr(key)


def test_load_or_create_persists_with_owner_only_mode(tmp_path):
    path = tmp_path / "coordinator.key"
    first = SigningKey.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    second = SigningKey.load_or_create(str(path))
    assert second.public_bytes() == first.public_bytes()
    assert verify(first.public_bytes(), b"m", second.sign(b"m"))


def test_load_or_create_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SigningKey.load_or_create(tmp_path / "nope" / "k.pem")


def test_load_or_create_refuses_a_file_that_is_not_a_key(tmp_path):
    path = tmp_path / "k.pem"
    path.write_bytes(b"hello, I am not a key\n")
    with pytest.raises(ValueError, match="not an unencrypted PEM private key"):
        SigningKey.load_or_create(path)
    assert path.read_bytes() == b"hello, I am not a key\n"  # never overwritten


def test_load_or_create_refuses_a_directory(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        SigningKey.load_or_create(tmp_path)

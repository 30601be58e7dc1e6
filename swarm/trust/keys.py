"""Signing keys: who may speak for the run.

docs/design.md section 4: only the coordinator's key may sign run specs and basis updates. This room
holds that key (Ed25519, from the `cryptography` package) and the one function every peer
uses to check a signature. The key file is PEM (PKCS#8, unencrypted), readable by its owner
only (one readable by others is used, with a warning); peers pin the coordinator by its raw
32-byte public key or its short fingerprint.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .state_dir import warn_if_exposed

__all__ = ["SigningKey", "verify", "fingerprint_of", "PUBLIC_KEY_BYTES", "SIGNATURE_BYTES"]

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
FINGERPRINT_HEX_CHARS = 16


def fingerprint_of(public: bytes) -> str:
    """Short hex name of a raw public key: the first 8 bytes of its sha256."""
    return hashlib.sha256(bytes(public)).hexdigest()[:FINGERPRINT_HEX_CHARS]


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key; `public_bytes()` is what others pin and verify against."""

    private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> SigningKey:
        """Load the key at `path`, or create one there (mode 0600) if the file does not exist."""
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"cannot keep a signing key at {path}: the directory {directory} does not exist.")
        if os.path.exists(path):
            return cls._load(path)
        key = cls.generate()
        pem = key.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        # O_EXCL: if another process created the file since the exists() check, keep theirs
        # rather than silently replacing an identity someone may already have pinned.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls._load(path)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        os.chmod(path, 0o600)  # the umask may have narrowed it further; never widened
        return key

    @classmethod
    def _load(cls, path: str) -> SigningKey:
        if not os.path.isfile(path):
            raise ValueError(f"the signing key path {path} exists but is not a regular file.")
        warn_if_exposed(path)
        with open(path, "rb") as f:
            data = f.read()
        try:
            private = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise ValueError(f"the file {path} is not an unencrypted PEM private key ({e}).") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise ValueError(f"the file {path} holds a {type(private).__name__}, not an Ed25519 private key.")
        return cls(private)

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(bytes(data))

    def public_bytes(self) -> bytes:
        """The raw 32-byte public key."""
        return self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def fingerprint(self) -> str:
        return fingerprint_of(self.public_bytes())

    def __repr__(self) -> str:
        # Never let a log line or a traceback print the private key material.
        return f"SigningKey(fingerprint={self.fingerprint()})"


def verify(public: bytes, data: bytes, signature: bytes) -> bool:
    """True if `signature` is `public`'s Ed25519 signature of `data`; False for anything else.

    Inputs come off the wire, so any garbage (wrong types, wrong lengths, a point that is not
    on the curve) is a refusal, never an exception.
    """
    if not all(isinstance(x, (bytes, bytearray, memoryview)) for x in (public, data, signature)):
        return False
    if len(public) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(bytes(public)).verify(bytes(signature), bytes(data))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True

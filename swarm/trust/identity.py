"""A node's libp2p identity, held in Python so that the node can sign what it writes to the DHT.

A libp2p peer id is derived from its public key (libp2p's peer-id spec): the key is encoded
as the protobuf `PublicKey{Type, Data}`; if that encoding is at most 42 bytes the peer id is
its *identity* multihash (0x00, length, bytes), else the sha2-256 multihash (0x12, 0x20,
sha256(bytes)); the text form is base58btc. An Ed25519 key encodes in 36 bytes, so its peer
id (`12D3KooW...`) contains the public key itself; an RSA key is hashed.

p2pd proves this identity on every connection. When Python holds the same private key, a
DHT record signed with it and filed under the peer id (`swarm/dht/envelope.py`) can be
checked by anyone without trusting whoever handed it over: `peer_id_of(public_key) ==
subkey` and the signature verifies. Hence every node runs with an identity file whose key
Python can read: the user's `--identity FILE` (Ed25519, or an RSA file from hivemind's
`P2P.generate_identity`), or a fresh Ed25519 key written to a private temporary file for
p2pd to read at start-up (`swarm/dht/process.py`).

Signatures: Ed25519 as usual; RSA as libp2p signs, PKCS#1 v1.5 over SHA-256.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import warnings
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.message import DecodeError

with warnings.catch_warnings():
    # hivemind's import runs torch.jit.script, which warns that it is deprecated; only that.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    from hivemind.proto import crypto_pb2

from .keys import SigningKey, verify
from .state_dir import warn_if_exposed

__all__ = ["Identity", "IdentityError", "ed25519_public_key", "peer_id_of", "public_key_proto", "verify_by"]

_IDENTITY_MAX = 42  # libp2p: keys encoding to at most this many bytes are inlined in the peer id
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_MAX_KEY_PROTO = 1024  # an RSA-4096 key encodes in ~550 bytes; anything longer is junk


class IdentityError(ValueError):
    """An identity file or a public key that cannot be used; the message says what to do."""


def _base58(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _BASE58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def public_key_proto(key_type: int, data: bytes) -> bytes:
    """libp2p's deterministic encoding of a public key: field 1 (type, varint), field 2 (bytes)."""
    return crypto_pb2.PublicKey(key_type=key_type, data=bytes(data)).SerializeToString(deterministic=True)


def peer_id_of(public_proto: bytes) -> str:
    """The base58 peer id of a protobuf-encoded libp2p public key (identity or sha2-256 multihash)."""
    public_proto = bytes(public_proto)
    if len(public_proto) <= _IDENTITY_MAX:
        return _base58(bytes([0x00, len(public_proto)]) + public_proto)
    return _base58(bytes([0x12, 0x20]) + hashlib.sha256(public_proto).digest())


def _decode_public(public_proto: object) -> crypto_pb2.PublicKey | None:
    """The key, if `public_proto` is exactly libp2p's canonical encoding of one (else None)."""
    if not isinstance(public_proto, bytes) or not 0 < len(public_proto) <= _MAX_KEY_PROTO:
        return None
    try:
        key = crypto_pb2.PublicKey.FromString(public_proto)
    except (DecodeError, ValueError):
        return None
    # a non-canonical encoding would name another peer id for the same key
    return key if public_key_proto(key.key_type, key.data) == public_proto else None


def ed25519_public_key(public_proto: object) -> bytes | None:
    """The raw 32-byte key inside an encoded Ed25519 public key, else None."""
    key = _decode_public(public_proto)
    return bytes(key.data) if key is not None and key.key_type == crypto_pb2.Ed25519 else None


def verify_by(public_proto: object, data: bytes, signature: object) -> bool:
    """True if `signature` over `data` verifies against the encoded libp2p key; False for anything else."""
    key = _decode_public(public_proto)
    if key is None or not isinstance(signature, bytes):
        return False
    if key.key_type == crypto_pb2.Ed25519:
        return verify(bytes(key.data), data, signature)
    if key.key_type == crypto_pb2.RSA:
        try:
            public = serialization.load_der_public_key(bytes(key.data))
            if not isinstance(public, rsa.RSAPublicKey) or public.key_size < 2048:
                return False
            public.verify(signature, bytes(data), padding.PKCS1v15(), hashes.SHA256())
        except (InvalidSignature, ValueError, TypeError):
            return False
        return True
    return False  # secp256k1 / ECDSA identities: p2pd accepts them, we do not sign with them


@dataclass(frozen=True)
class Identity:
    """A libp2p private key (Ed25519 or RSA) that Python can sign with; `peer_id` is what p2pd announces."""

    private: Ed25519PrivateKey | rsa.RSAPrivateKey
    public_proto: bytes = field(init=False)
    peer_id: str = field(init=False)

    def __post_init__(self) -> None:
        if isinstance(self.private, Ed25519PrivateKey):
            raw = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            proto = public_key_proto(crypto_pb2.Ed25519, raw)
        else:
            der = self.private.public_key().public_bytes(serialization.Encoding.DER,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo)
            proto = public_key_proto(crypto_pb2.RSA, der)
        object.__setattr__(self, "public_proto", proto)
        object.__setattr__(self, "peer_id", peer_id_of(proto))

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def of_key(cls, key: SigningKey) -> Identity:
        """The swarm's signing key as a record signer (its records are filed by fingerprint, not peer id)."""
        return cls(key.private)

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "the identity") -> Identity:
        """Parse libp2p's protobuf `PrivateKey` (what p2pd reads with `-id`)."""
        try:
            msg = crypto_pb2.PrivateKey.FromString(data)
        except (DecodeError, ValueError):
            raise IdentityError(f"{where} is not a libp2p private key file; make one with "
                                f"`swarm identity FILE`.") from None
        if msg.key_type == crypto_pb2.Ed25519 and len(msg.data) in (64, 96):
            # go-libp2p writes seed || public key (older versions repeat the public key once more)
            return cls(Ed25519PrivateKey.from_private_bytes(bytes(msg.data[:32])))
        if msg.key_type == crypto_pb2.RSA:
            try:
                private = serialization.load_der_private_key(bytes(msg.data), password=None)
            except (ValueError, TypeError):
                private = None
            if isinstance(private, rsa.RSAPrivateKey):
                return cls(private)
        raise IdentityError(f"{where} holds a libp2p key this swarm cannot sign with (Ed25519 and RSA are "
                            f"supported); make a new one with `swarm identity FILE`.")

    def to_bytes(self) -> bytes:
        if isinstance(self.private, Ed25519PrivateKey):
            seed = self.private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                              serialization.NoEncryption())
            return crypto_pb2.PrivateKey(key_type=crypto_pb2.Ed25519,
                                         data=seed + self.public_proto[4:]).SerializeToString()
        der = self.private.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                                         serialization.NoEncryption())
        return crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Identity:
        """The identity in `path`, or a new Ed25519 one written there (mode 0600) if there is no file."""
        path = os.fspath(path)
        if os.path.exists(path):
            if not os.path.isfile(path):
                raise IdentityError(f"the identity path {path} exists but is not a regular file.")
            warn_if_exposed(path)
            with open(path, "rb") as f:
                return cls.from_bytes(f.read(), f"the file {path}")
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise IdentityError(f"cannot keep an identity at {path}: the directory {directory} does not exist.")
        identity = cls.generate()
        try:  # O_EXCL: a file another process created meanwhile is theirs to keep
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls.load_or_create(path)
        with os.fdopen(fd, "wb") as f:
            f.write(identity.to_bytes())
        return identity

    @staticmethod
    def lock(path: str | os.PathLike[str]) -> int:
        """Hold `path` for this process (an advisory lock on `path.lock`, released when the process
        ends, however it ends); IdentityError if another running process holds it. One identity in
        two running peers would make them one peer id to the swarm."""
        fd = os.open(f"{os.fspath(path)}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise IdentityError(f"the identity file {os.fspath(path)} is in use by another running peer; give each "
                                f"peer its own --identity file, or stop the other one first.") from None
        return fd

    def write_private_file(self) -> tuple[str, str]:
        """Write the key to a new 0700 temporary folder for p2pd to read; returns (file, folder to remove)."""
        folder = tempfile.mkdtemp(prefix="swarm-identity-")
        path = os.path.join(folder, "identity.key")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.to_bytes())
        return path, folder

    def sign(self, data: bytes) -> bytes:
        if isinstance(self.private, Ed25519PrivateKey):
            return self.private.sign(bytes(data))
        return self.private.sign(bytes(data), padding.PKCS1v15(), hashes.SHA256())

    def __repr__(self) -> str:
        return f"Identity(peer_id={self.peer_id})"  # never the private key


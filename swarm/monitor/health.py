"""Health records: what each peer tells the swarm about itself, signed, for dashboards.

Every peer publishes one small record per heartbeat under

    subspace-swarm/{run_hash}/health      subkey = peer id (base58)  -> signed HealthRecord

(the key is spelled by `swarm.dht.health_key`). A record expires after the peer's ttl
(~15 s), so a peer that dies disappears on its own. Each peer process signs with its own
Ed25519 key (`SigningKey.generate()`, one per process): the signature covers a canonical
msgpack of every field (domain tag, public key, then the fields in schema order), so a
record cannot be altered in flight or replayed as another message.

The DHT checks no signatures, so a reader must: `parse_health(subkey, value)` refuses a
record that is malformed, whose signature does not verify, or that is filed under another
peer's id. Binding a key to a peer id is the reader's job too (the first key seen for a
peer id is pinned: `swarm/dashboard/book.py`), because the libp2p identity key lives in
p2pd and cannot sign here.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import msgpack
from hivemind.utils import get_dht_time

from swarm.dht import STATES, RecordError, SwarmDHT, health_key
from swarm.keys import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, SigningKey, fingerprint_of, verify

__all__ = ["HEALTH_DOMAIN", "REACHABILITY", "HealthRecord", "SignedHealth", "parse_health", "publish_health",
           "fetch_health", "reachability_of"]

HEALTH_DOMAIN = "subspace-swarm/health/v1"
REACHABILITY = ("direct", "relayed")
MAX_BANNED = 32  # a record lists at most this many failing peers (the most failures first)
MAX_HISTORY = 64  # and at most this many (step, loss, time) points since its previous beat
_MAX_TEXT = 128


def _fail(message: str) -> None:
    raise RecordError(message)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class HealthRecord:
    """One peer's health, as published; every number is measured by the peer itself."""

    peer_id: str
    run_hash: str
    stage: int
    state: str  # one of STATES
    step: int  # optimizer steps this stage has done
    tokens_per_s: float  # tokens this peer passed on per second, over its last beat
    queue: int
    loss: float | None  # head: mean loss of its last step; tail: its last microbatch's; else None
    loss_history: list[list[float]]  # [step, loss, unix time] of steps since its previous beat
    bytes_in_per_s: float
    bytes_out_per_s: float
    bytes_in: int  # totals since start, framing included (what the transport counted)
    bytes_out: int
    act_bytes_out: int  # forward: activation bytes sent and the tokens they carried
    act_tokens_out: int
    grad_bytes_out: int  # backward: gradient bytes sent and their tokens
    grad_tokens_out: int
    codec: str
    rank: int
    basis_version: int
    basis_updated_step: int  # the step at which the current basis took effect (0: the initial one)
    device: str  # "cpu" or the GPU's name
    memory_bytes: int  # GPU memory allocated, or the process's resident memory on CPU
    uptime_s: float
    reachability: str  # one of REACHABILITY
    version: str  # software version
    refused: int  # inbound messages this peer refused
    banned: dict[str, int]  # peers this peer's router saw fail -> failures
    timestamp: float = field(default_factory=get_dht_time)

    def __post_init__(self) -> None:
        for name in ("peer_id", "run_hash", "codec", "device", "version"):
            value = getattr(self, name)
            if not (isinstance(value, str) and 0 < len(value) <= _MAX_TEXT):
                _fail(f"the health record's {name} must be a short non-empty string.")
        for name in ("stage", "step", "queue", "bytes_in", "bytes_out", "act_bytes_out", "act_tokens_out",
                     "grad_bytes_out", "grad_tokens_out", "rank", "basis_version", "basis_updated_step",
                     "memory_bytes", "refused"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 0):
                _fail(f"the health record's {name} must be a non-negative integer, not {value!r}.")
        for name in ("tokens_per_s", "bytes_in_per_s", "bytes_out_per_s", "uptime_s", "timestamp"):
            value = getattr(self, name)
            if not (_is_finite(value) and value >= 0):
                _fail(f"the health record's {name} must be a finite non-negative number, not {value!r}.")
            setattr(self, name, float(value))
        if self.loss is not None:
            if not _is_finite(self.loss):
                _fail(f"the health record's loss must be a finite number or nil, not {self.loss!r}.")
            self.loss = float(self.loss)
        if self.state not in STATES:
            _fail(f"the health record's state must be one of {', '.join(STATES)}, not {self.state!r}.")
        if self.reachability not in REACHABILITY:
            _fail(f"the health record's reachability must be one of {', '.join(REACHABILITY)}.")
        if not (isinstance(self.banned, dict) and len(self.banned) <= MAX_BANNED
                and all(isinstance(k, str) and 0 < len(k) <= _MAX_TEXT and _is_int(v) and v > 0
                        for k, v in self.banned.items())):
            _fail(f"the health record's banned must map at most {MAX_BANNED} peer ids to failure counts.")
        if not (isinstance(self.loss_history, (list, tuple)) and len(self.loss_history) <= MAX_HISTORY
                and all(isinstance(p, (list, tuple)) and len(p) == 3 and _is_int(p[0]) and p[0] >= 0
                        and _is_finite(p[1]) and _is_finite(p[2]) for p in self.loss_history)):
            _fail(f"the health record's loss_history must be at most {MAX_HISTORY} [step, loss, time] points.")
        self.loss_history = [[int(s), float(v), float(t)] for s, v, t in self.loss_history]

    def signing_bytes(self, public_key: bytes) -> bytes:
        """Canonical bytes: the fields in schema order, `banned` sorted, behind a domain tag and the key."""
        values = [getattr(self, f.name) for f in fields(self)]
        values[[f.name for f in fields(self)].index("banned")] = sorted(self.banned.items())
        return msgpack.packb([HEALTH_DOMAIN, bytes(public_key), values], use_bin_type=True)

    @property
    def forward_bytes_per_token(self) -> float | None:
        return self.act_bytes_out / self.act_tokens_out if self.act_tokens_out else None

    @property
    def backward_bytes_per_token(self) -> float | None:
        return self.grad_bytes_out / self.grad_tokens_out if self.grad_tokens_out else None


@dataclass(frozen=True)
class SignedHealth:
    record: HealthRecord
    public_key: bytes
    signature: bytes

    @classmethod
    def create(cls, record: HealthRecord, key: SigningKey) -> SignedHealth:
        public = key.public_bytes()
        return cls(record, public, key.sign(record.signing_bytes(public)))

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.public_key)

    def to_value(self) -> dict:
        return {**asdict(self.record), "public_key": self.public_key, "signature": self.signature}


def parse_health(subkey: object, value: object) -> SignedHealth:
    """A verified record from one DHT entry; RecordError if it is malformed, forged or misfiled."""
    if not isinstance(value, dict):
        _fail(f"a health record must be a map, not {type(value).__name__}.")
    public, signature = value.get("public_key"), value.get("signature")
    if not (isinstance(public, bytes) and len(public) == PUBLIC_KEY_BYTES):
        _fail("the health record carries no valid public key.")
    if not (isinstance(signature, bytes) and len(signature) == SIGNATURE_BYTES):
        _fail("the health record carries no valid signature.")
    names = [f.name for f in fields(HealthRecord)]
    missing = [n for n in names if n not in value]
    if missing:
        _fail(f"the health record lacks {', '.join(missing)}.")
    try:
        record = HealthRecord(**{n: value[n] for n in names})  # unknown keys are ignored: newer peers may add some
    except TypeError as e:  # e.g. an unhashable key inside banned
        raise RecordError(f"the health record is malformed ({e}).") from None
    if not verify(public, record.signing_bytes(public), signature):
        _fail(f"the health record of {record.peer_id[-8:]} does not verify against its key {fingerprint_of(public)}.")
    if record.peer_id != subkey:
        _fail("the health record is filed under another peer's id.")
    return SignedHealth(record, public, signature)


def reachability_of(maddrs: list[str]) -> str:
    """"relayed" if every address we are visible at goes through a relay circuit, else "direct"."""
    return "relayed" if maddrs and all("/p2p-circuit" in m for m in maddrs) else "direct"


async def publish_health(sdht: SwarmDHT, signed: SignedHealth, ttl: float) -> bool:
    """Store the record for `ttl` seconds under this peer's id; False if no DHT node stored it."""
    record = signed.record
    return bool(await sdht.dht.store(health_key(record.run_hash), signed.to_value(), get_dht_time() + ttl,
                                     subkey=record.peer_id, return_future=True))


async def fetch_health(sdht: SwarmDHT, run_hash: str) -> list[tuple[object, object, float]]:
    """Raw unexpired entries (subkey, value, expiration) under the run's health key; unverified.

    A plain value where a map of peers belongs comes back as one entry with subkey None, so
    that the reader counts it as invalid like any other bad entry.
    """
    found = await sdht.dht.get(health_key(run_hash), latest=True, return_future=True)
    if found is None:
        return []
    if not isinstance(found.value, dict):
        return [(None, found.value, found.expiration_time)]
    now = get_dht_time()
    return [(subkey, item.value, item.expiration_time) for subkey, item in found.value.items()
            if item.expiration_time > now]

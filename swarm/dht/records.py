"""Every DHT key and record schema of the swarm (the store that reads and writes them: `store.py`).

Peers find each other here, and nowhere else may a DHT key be spelled. Records are plain
msgpack-able dicts made from the dataclasses below; whatever comes back from the DHT is
untrusted, so it is parsed back through the same dataclasses and refused or skipped when it
does not fit.

Keys (a swarm hosts one run):

    subspace-swarm/run                         subkey = signer's key fingerprint -> SignedRunSpec
    subspace-swarm/{run_hash}/stage/{stage}    subkey = peer id (base58)         -> StageAnnouncement
    subspace-swarm/{run_hash}/basis            subkey = version                  -> signed basis update bytes
                                                 (protocol/basis_update.py; verified by the reader)
    subspace-swarm/{run_hash}/health           subkey = peer id (base58)         -> signed HealthRecord
                                                 (swarm/monitor/health.py; verified by the reader)

The run spec is stored under its signer's fingerprint so that an impostor's entry sits beside
the coordinator's instead of replacing it; a peer that pins the coordinator's key picks the
right one. (hivemind itself checks no signatures here: a hostile peer can still write junk or
expire entries early. Pinning turns that into a clear refusal, never a silent wrong run.)

Run hash rule: `run_hash_of(spec_json)` = the first 16 hex digits of sha256 of the spec's UTF-8
JSON text, exactly as published; the coordinator signs msgpack([RUN_SPEC_DOMAIN, spec_json,
run_hash]), the domain tag keeping a run-spec signature from being replayed as another message.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import asdict, dataclass, field, fields

import msgpack

with warnings.catch_warnings():
    # hivemind's import runs torch.jit.script, which warns that it is deprecated; only that.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    from hivemind.utils import get_dht_time

from peer.interfaces import STATES
from swarm.keys import SigningKey, fingerprint_of, verify

__all__ = [
    "RUN_KEY", "RUN_SPEC_DOMAIN", "STATES", "RecordError", "SignedRunSpec", "StageAnnouncement",
    "basis_key", "health_key", "run_hash_of", "stage_key",
]


RUN_KEY = "subspace-swarm/run"
RUN_SPEC_DOMAIN = "subspace-swarm/run-spec/v1"
_MAX_MADDRS, _MAX_TEXT = 32, 512


class RecordError(ValueError):
    """A DHT record that is malformed, badly signed, or signed by the wrong key."""


def run_hash_of(spec_json: str) -> str:
    return hashlib.sha256(spec_json.encode("utf-8")).hexdigest()[:16]


def basis_key(run_hash: str) -> str:
    return f"subspace-swarm/{run_hash}/basis"


def stage_key(run_hash: str, stage: int) -> str:
    return f"subspace-swarm/{run_hash}/stage/{stage}"


def health_key(run_hash: str) -> str:
    return f"subspace-swarm/{run_hash}/health"


def run_spec_signing_bytes(spec_json: str, run_hash: str) -> bytes:
    return msgpack.packb([RUN_SPEC_DOMAIN, spec_json, run_hash], use_bin_type=True)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise RecordError(message)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _from_dict(cls, record: object, what: str) -> dict:
    _require(isinstance(record, dict), f"a {what} record must be a map, not {type(record).__name__}.")
    names = [f.name for f in fields(cls)]
    missing = [n for n in names if n not in record]
    _require(not missing, f"the {what} record lacks {', '.join(missing)}.")
    return {n: record[n] for n in names}  # unknown keys are ignored: newer peers may add fields


@dataclass(frozen=True)
class SignedRunSpec:
    spec_json: str
    run_hash: str
    public_key: bytes
    signature: bytes

    @classmethod
    def create(cls, spec_json: str, key: SigningKey) -> SignedRunSpec:
        run_hash = run_hash_of(spec_json)
        return cls(spec_json, run_hash, key.public_bytes(), key.sign(run_spec_signing_bytes(spec_json, run_hash)))

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.public_key)

    def to_record(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: object) -> SignedRunSpec:
        values = _from_dict(cls, record, "run spec")
        _require(isinstance(values["spec_json"], str), "the run spec's spec_json must be a string.")
        _require(isinstance(values["run_hash"], str), "the run spec's run_hash must be a string.")
        for name in ("public_key", "signature"):
            _require(isinstance(values[name], bytes), f"the run spec's {name} must be bytes.")
        return cls(**values)

    def verify(self, trusted_key: bytes | None = None) -> None:
        """Raise RecordError unless the hash rule holds, the signature verifies, and the signer is trusted."""
        _require(self.run_hash == run_hash_of(self.spec_json),
                 f"the run spec's hash {self.run_hash!r} does not match its text.")
        _require(
            verify(self.public_key, run_spec_signing_bytes(self.spec_json, self.run_hash), self.signature),
            f"the run spec's signature does not verify against its key {self.fingerprint}.",
        )
        if trusted_key is not None and bytes(trusted_key) != self.public_key:
            raise RecordError(f"the run spec is signed by key {self.fingerprint}, "
                              f"not by the trusted key {fingerprint_of(trusted_key)}.")


@dataclass
class StageAnnouncement:
    # run_hash travels in the record so that announce() can find the key from the record
    # alone, and so that an entry filed under the wrong run is recognisable as such.
    peer_id: str
    run_hash: str
    stage: int
    maddrs: list[str]
    throughput: float  # tokens/s this peer can process
    queue: int  # microbatches waiting
    basis_version: int
    state: str  # one of STATES
    version: str  # software version
    step: int = 0  # the step this peer's stage is on
    timestamp: float = field(default_factory=get_dht_time)

    def __post_init__(self) -> None:
        for name in ("peer_id", "run_hash"):
            value = getattr(self, name)
            _require(isinstance(value, str) and 0 < len(value) <= 128, f"{name} must be a short non-empty string.")
        for name in ("stage", "queue", "basis_version", "step"):
            value = getattr(self, name)
            _require(_is_int(value) and value >= 0, f"{name} must be a non-negative integer, not {value!r}.")
        _require(
            isinstance(self.maddrs, (list, tuple)) and len(self.maddrs) <= _MAX_MADDRS
            and all(isinstance(m, str) and len(m) <= _MAX_TEXT for m in self.maddrs),
            f"maddrs must be a list of at most {_MAX_MADDRS} strings.",
        )
        self.maddrs = list(self.maddrs)
        for name in ("throughput", "timestamp"):
            value = getattr(self, name)
            _require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                     f"{name} must be a finite number, not {value!r}.")
            setattr(self, name, float(value))
        _require(self.throughput >= 0, "throughput must not be negative.")
        _require(self.state in STATES, f"state must be one of {', '.join(STATES)}, not {self.state!r}.")
        _require(isinstance(self.version, str) and len(self.version) <= 64, "version must be a short string.")

    def to_record(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: object) -> StageAnnouncement:
        return cls(**_from_dict(cls, record, "stage announcement"))

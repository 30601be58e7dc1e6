"""Every DHT key and record schema of the swarm (the store that reads and writes them: `store.py`).

Peers find each other here, and nowhere else may a DHT key be spelled. Records are plain msgpack-able
dicts made from the dataclasses below; whatever comes back from the DHT is untrusted, so it is parsed
back through the same dataclasses and refused or skipped when it does not fit.

Keys (a swarm hosts one run), each with the longest life a record under it may claim:

    subspace-swarm/run                       subkey = swarm key fingerprint      -> SignedRunSpec      1 h
    subspace-swarm/{run_hash}/stage/{stage}  subkey = writer's peer id (base58)  -> StageAnnouncement  5 min
    subspace-swarm/{run_hash}/basis          subkey = "{version}:{fingerprint}"  -> basis update bytes 1 day
                                               (protocol/basis_update.py; verified by the reader)
    subspace-swarm/{run_hash}/health         subkey = writer's peer id (base58)  -> HealthRecord       5 min
                                               (swarm/monitor/health.py)
    subspace-swarm/{run_hash}/lease          subkey = swarm key fingerprint      -> LeaderLease        1 day
                                               (who may lead, in order: swarm/replicas/leases.py)
    subspace-swarm/{run_hash}/coordinator    subkey = "{fingerprint}:{peer id}"  -> CoordinatorClaim   1 day  (seat.py)

Every value is a signed envelope (`envelope.py`): only the owner of a subkey can write it,
the peer whose libp2p key hashes to the peer id, or, for swarm-wide records, the swarm key
whose fingerprint the subkey names. An impostor's run spec or basis update therefore sits
beside the coordinator's under its own fingerprint instead of replacing it, and readers take
only the key the run spec names (pinned with --swarm-key).

Run hash rule: `run_hash_of(spec_json)` = the first 16 hex digits of sha256 of the spec's UTF-8
JSON text, exactly as published; the coordinator signs msgpack([RUN_SPEC_DOMAIN, spec_json,
run_hash]), the domain tag keeping a run-spec signature from being replayed as another message.
"""

from __future__ import annotations

import hashlib
import math
import re
import warnings
from dataclasses import MISSING, asdict, dataclass, field, fields

import msgpack

with warnings.catch_warnings():
    # hivemind's import runs torch.jit.script, which warns that it is deprecated; only that.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    from hivemind.utils import get_dht_time

from peer.daemon.interfaces import STATES
from swarm.trust.keys import SigningKey, fingerprint_of, verify

__all__ = [
    "KEY_KINDS", "RUN_KEY", "RUN_SPEC_DOMAIN", "STATES", "CoordinatorClaim", "KeyKind", "LeaderLease", "Pardons",
    "RecordError", "SignedRunSpec", "StageAnnouncement", "VouchedSnapshots", "basis_key", "basis_subkey",
    "coordinator_key", "health_key", "kind_of", "lease_key", "pardons_key", "parse_basis_subkey", "run_hash_of",
    "snapshots_key", "stage_key", "states_key",
]

RUN_KEY = "subspace-swarm/run"
RUN_SPEC_DOMAIN = "subspace-swarm/run-spec/v1"
_MAX_MADDRS, _MAX_TEXT, _MAX_HEADS, _MAX_PARDONS = 32, 512, 256, 1024
MAX_REVOKED = 4 * _MAX_HEADS  # revocations a lease may carry (the coordinator keeps its list within it: leases.py)
_MAX_VOUCHED = 64  # swarm/replicas/vouched.py KEEP_STATES: ~64 x stages x 70 bytes in one record


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


def lease_key(run_hash: str) -> str:
    return f"subspace-swarm/{run_hash}/lease"


def snapshots_key(run_hash: str) -> str:
    return f"subspace-swarm/{run_hash}/snapshots"


def states_key(run_hash: str) -> str:
    """Where the swarm key vouches for the stages' state hashes after each step (a VouchedSnapshots record)."""
    return f"subspace-swarm/{run_hash}/states"


def pardons_key(run_hash: str) -> str:
    """Where the swarm key lifts bans (`Pardons`: `swarm unban`)."""
    return f"subspace-swarm/{run_hash}/pardons"


def coordinator_key(run_hash: str) -> str:
    """Where coordinators that hold the swarm key claim the seat of the active one (`CoordinatorClaim`)."""
    return f"subspace-swarm/{run_hash}/coordinator"


def basis_subkey(version: int, fingerprint: str) -> str:
    return f"{int(version)}:{fingerprint}"


def parse_basis_subkey(subkey: object) -> tuple[int, str] | None:
    """(version, signer fingerprint) of a basis subkey, or None if it is not one."""
    m = re.fullmatch(r"(0|[1-9][0-9]{0,8}):([0-9a-f]{16})", subkey) if isinstance(subkey, str) else None
    return (int(m.group(1)), m.group(2)) if m else None


@dataclass(frozen=True)
class KeyKind:
    """One kind of DHT key: how it is spelled, how long a record may claim to live, who owns a subkey."""

    name: str
    pattern: str  # full-match regex of the key
    max_ttl: float  # seconds; an expiry further out than now + max_ttl (+ clock skew) is refused
    owner: str  # "peer": the subkey is the writer's peer id; "swarm": it names the swarm key's fingerprint


_RUN = "[0-9a-f]{16}"
KEY_KINDS = (
    KeyKind("run", re.escape(RUN_KEY), 3600.0, "swarm"),
    KeyKind("stage", rf"subspace-swarm/{_RUN}/stage/(0|[1-9][0-9]{{0,3}})", 300.0, "peer"),
    KeyKind("basis", rf"subspace-swarm/{_RUN}/basis", 86400.0, "swarm"),
    KeyKind("health", rf"subspace-swarm/{_RUN}/health", 300.0, "peer"),
    KeyKind("lease", rf"subspace-swarm/{_RUN}/lease", 86400.0, "swarm"),
    KeyKind("snapshots", rf"subspace-swarm/{_RUN}/snapshots", 86400.0, "swarm"),
    KeyKind("states", rf"subspace-swarm/{_RUN}/states", 86400.0, "swarm"),
    KeyKind("pardons", rf"subspace-swarm/{_RUN}/pardons", 86400.0, "swarm"),
    KeyKind("coordinator", rf"subspace-swarm/{_RUN}/coordinator", 86400.0, "swarm"),
)


def kind_of(key: object) -> KeyKind | None:
    if isinstance(key, str) and len(key) <= 128:
        for kind in KEY_KINDS:
            if re.fullmatch(kind.pattern, key):
                return kind
    return None


def run_spec_signing_bytes(spec_json: str, run_hash: str) -> bytes:
    return msgpack.packb([RUN_SPEC_DOMAIN, spec_json, run_hash], use_bin_type=True)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise RecordError(message)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _from_dict(cls, record: object, what: str) -> dict:
    _require(isinstance(record, dict), f"a {what} record must be a map, not {type(record).__name__}.")
    # a field with a plain default may be absent (older peers did not send it); unknown keys are
    # ignored (newer peers may add fields)
    missing = [f.name for f in fields(cls) if f.name not in record and f.default is MISSING]
    _require(not missing, f"the {what} record lacks {', '.join(missing)}.")
    return {f.name: record[f.name] for f in fields(cls) if f.name in record}


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
    leads: bool = False  # a head that drives the steps (peer/step/leadership.py)
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
        _require(isinstance(self.leads, bool) and (not self.leads or self.stage == 0), "only a head may lead.")

    def to_record(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: object) -> StageAnnouncement:
        return cls(**_from_dict(cls, record, "stage announcement"))


@dataclass
class LeaderLease:
    """Which heads may lead, in order, as the swarm key decided (the envelope carries its signature).

    The live head that comes first in `order` leads; the ones after it are its successors, so
    when the leader dies the next live one leads at once, with or without the coordinator.
    `term` grows with every change of the order (a reader keeps the highest term it has seen,
    so an older lease cannot come back); a head absent from `order` never leads.

    `rollback_id` > 0 orders a rollback (issue 20, item 2): the `rollback_id`-th revocation took the
    lease from `rollback_of`, caught feeding other data at step `rollback_caught` (counted from 1),
    and the steps it drove come after the snapshot step `rollback_to`, the newest that a head the
    lease still trusts vouched for: the next leader rolls the swarm back to it before it drives
    (`peer/state/rollback.py`). Only the swarm key signs a lease, so only it can order one.
    """

    run_hash: str
    term: int
    order: list[str]
    issued: float = field(default_factory=get_dht_time)
    revoked: list[str] = field(default_factory=list)  # heads caught lying (swarm/replicas/data_check.py): never again
    rollback_id: int = 0  # 0: no rollback ordered
    rollback_to: int = 0
    rollback_caught: int = 0
    rollback_of: str = ""

    def __post_init__(self) -> None:
        _require(isinstance(self.run_hash, str) and 0 < len(self.run_hash) <= 128, "run_hash must be a short string.")
        _require(_is_int(self.term) and self.term >= 0, f"term must be a non-negative integer, not {self.term!r}.")
        _require(isinstance(self.order, (list, tuple)) and len(self.order) <= _MAX_HEADS
                 and all(isinstance(p, str) and 0 < len(p) <= 128 for p in self.order)
                 and len(set(self.order)) == len(self.order),
                 f"order must be a list of at most {_MAX_HEADS} distinct peer ids.")
        self.order = list(self.order)
        _require(isinstance(self.revoked, (list, tuple)) and len(self.revoked) <= MAX_REVOKED
                 and all(isinstance(p, str) and 0 < len(p) <= 128 for p in self.revoked),
                 f"revoked must be a list of at most {MAX_REVOKED} peer ids.")
        self.revoked = list(self.revoked)
        _require(all(_is_int(v) and 0 <= v < 2**31 for v in (self.rollback_id, self.rollback_to, self.rollback_caught))
                 and isinstance(self.rollback_of, str) and len(self.rollback_of) <= 128
                 and (self.rollback_id == 0 or 0 < self.rollback_to <= self.rollback_caught),
                 "a rollback order names a snapshot step after 0 and no later than the step caught.")
        _require(isinstance(self.issued, (int, float)) and not isinstance(self.issued, bool)
                 and math.isfinite(self.issued), "issued must be a finite number.")
        self.issued = float(self.issued)

    def to_record(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: object) -> LeaderLease:
        return cls(**_from_dict(cls, record, "leader lease"))


@dataclass
class CoordinatorClaim:
    """A coordinator's claim to be the run's active one, signed by the swarm key and filed under "{fingerprint}:
    {peer_id}", so that claims stand side by side. Of the live claims (DHT time < `until`; its holder renews it)
    the highest `term` holds the seat, of equal terms the lowest peer id (only the swarm key's holder can claim:
    no stranger's id order counts). A claim stays readable long after `until`, so that every later term is
    numbered after it. `since`: when the term began (swarm/coordinator/seat.py)."""

    run_hash: str
    term: int
    peer_id: str
    since: float
    until: float
    maddrs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _require(all(isinstance(x, str) and 0 < len(x) <= 128 for x in (self.run_hash, self.peer_id))
                 and _is_int(self.term) and 0 < self.term < 2**62 and all(isinstance(t, (int, float))
                 and not isinstance(t, bool) and math.isfinite(t) for t in (self.since, self.until)),
                 "a coordinator claim names a run, a peer id, a positive term and finite times.")
        _require(isinstance(self.maddrs, (list, tuple)) and len(self.maddrs) <= _MAX_MADDRS
                 and all(isinstance(m, str) and len(m) <= _MAX_TEXT for m in self.maddrs),
                 f"maddrs must be a list of at most {_MAX_MADDRS} strings.")
        self.since, self.until, self.maddrs = float(self.since), float(self.until), list(self.maddrs)

    def to_record(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: object) -> CoordinatorClaim:
        return cls(**_from_dict(cls, record, "coordinator claim"))


@dataclass
class VouchedSnapshots:
    """The snapshot hashes the swarm key vouches for: step -> stage -> sha256 hex, for the newest
    few snapshot steps at which the leading head saw every stage's replicas agree (it signed that
    in a work record, protocol/step_record.py). A peer that restores a stage loads only a snapshot
    whose hash is here, whatever most custodians claim."""

    run_hash: str
    steps: dict[int, dict[int, str]]

    def __post_init__(self) -> None:
        _require(isinstance(self.run_hash, str) and 0 < len(self.run_hash) <= 128, "run_hash must be a short string.")
        _require(isinstance(self.steps, dict) and len(self.steps) <= _MAX_VOUCHED
                 and all(_is_int(t) and t > 0 and isinstance(h, dict) and len(h) <= 4096
                         and all(_is_int(s) and s >= 0 and isinstance(x, str) and len(x) == 64 for s, x in h.items())
                         for t, h in self.steps.items()),
                 f"steps must map at most {_MAX_VOUCHED} steps to {{stage: sha256 hex}}.")

    def to_record(self) -> dict:
        return {"run_hash": self.run_hash, "steps": {t: dict(h) for t, h in self.steps.items()}}

    @classmethod
    def from_record(cls, record: object) -> VouchedSnapshots:
        return cls(**_from_dict(cls, record, "vouched snapshots"))


@dataclass
class Pardons:
    """Bans the swarm key lifted (`swarm unban`): peer id -> the unix time of its pardon. A peer's ban for the run
    (a conviction of the leading head, `peer/checks/spot_checks.py`) told before that time no longer holds; a
    conviction after it does (`swarm/replicas/run_bans.py`). A head's revoked lease is not lifted. Only the swarm
    key signs one."""

    run_hash: str
    peers: dict[str, float]

    def __post_init__(self) -> None:
        _require(isinstance(self.run_hash, str) and 0 < len(self.run_hash) <= 128, "run_hash must be a short string.")
        _require(isinstance(self.peers, dict) and len(self.peers) <= _MAX_PARDONS
                 and all(isinstance(p, str) and 0 < len(p) <= 128 and isinstance(t, (int, float))
                         and not isinstance(t, bool) and math.isfinite(t) for p, t in self.peers.items()),
                 f"peers must map at most {_MAX_PARDONS} peer ids to the time of their pardon.")
        self.peers = {p: float(t) for p, t in self.peers.items()}

    def to_record(self) -> dict:
        return {"run_hash": self.run_hash, "peers": dict(self.peers)}

    @classmethod
    def from_record(cls, record: object) -> Pardons:
        return cls(**_from_dict(cls, record, "pardons"))

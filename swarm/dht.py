"""Every DHT key and record schema of the swarm, over `hivemind.DHT`.

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
                                                 (swarm/health.py; verified by the reader)

The run spec is stored under its signer's fingerprint so that an impostor's entry sits beside
the coordinator's instead of replacing it; a peer that pins the coordinator's key picks the
right one. (hivemind itself checks no signatures here: a hostile peer can still write junk or
expire entries early. Pinning turns that into a clear refusal, never a silent wrong run.)

Run hash rule: `run_hash_of(spec_json)` = the first 16 hex digits of sha256 of the spec's UTF-8
JSON text, exactly as published; the coordinator signs msgpack([RUN_SPEC_DOMAIN, spec_json,
run_hash]), the domain tag keeping a run-spec signature from being replayed as another message.

Every DHT call here is made with `return_future=True` and awaited, so the caller's asyncio
loop never blocks on the DHT process.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

import msgpack

with warnings.catch_warnings():
    # hivemind's import runs torch.jit.script, which warns that it is deprecated; only that.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    import hivemind
    from hivemind.utils import get_dht_time

from swarm.dht_process import close_node, start_dht, stop_dht  # noqa: F401 (re-exported: one import for users)
from swarm.keys import SigningKey, fingerprint_of, verify

__all__ = [
    "RUN_KEY", "RUN_SPEC_DOMAIN", "STATES", "RecordError", "SignedRunSpec", "StageAnnouncement", "SwarmDHT",
    "basis_key", "close_node", "health_key", "run_hash_of", "stage_key", "start_dht", "stop_dht",
]

logger = logging.getLogger(__name__)

RUN_KEY = "subspace-swarm/run"
RUN_SPEC_DOMAIN = "subspace-swarm/run-spec/v1"
STATES = ("joining", "online", "leaving")
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
        _require(
            self.run_hash == run_hash_of(self.spec_json), f"the run spec's hash {self.run_hash!r} does not match its text."
        )
        _require(
            verify(self.public_key, run_spec_signing_bytes(self.spec_json, self.run_hash), self.signature),
            f"the run spec's signature does not verify against its key {self.fingerprint}.",
        )
        if trusted_key is not None and bytes(trusted_key) != self.public_key:
            raise RecordError(
                f"the run spec is signed by key {self.fingerprint}, not by the trusted key {fingerprint_of(trusted_key)}."
            )


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
    timestamp: float = field(default_factory=get_dht_time)

    def __post_init__(self) -> None:
        for name in ("peer_id", "run_hash"):
            value = getattr(self, name)
            _require(isinstance(value, str) and 0 < len(value) <= 128, f"{name} must be a short non-empty string.")
        for name in ("stage", "queue", "basis_version"):
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


async def _visible_maddrs(_dht: hivemind.DHT, node) -> list[str]:
    # Runs inside the DHT process (via run_coroutine), hence module-level and picklable.
    return [str(m) for m in await node.get_visible_maddrs()]


class SwarmDHT:
    """The swarm's records over a started `hivemind.DHT` (not owned: stop it with `stop_dht`)."""

    def __init__(self, dht: hivemind.DHT) -> None:
        self.dht = dht
        self.skipped_records = 0  # malformed or badly signed entries seen, for health reports

    def _skip(self, where: str, problem: str) -> None:
        self.skipped_records += 1
        logger.debug("skipped a record under %s: %s", where, problem)

    async def publish_run_spec(self, spec_json: str, key: SigningKey, ttl: float) -> SignedRunSpec:
        record = SignedRunSpec.create(spec_json, key)
        stored = await self.dht.store(
            RUN_KEY, record.to_record(), get_dht_time() + ttl, subkey=record.fingerprint, return_future=True
        )
        if not stored:
            raise RuntimeError("the DHT did not store the run spec (no node answered, or it holds a later one).")
        return record

    async def fetch_run_spec(self, trusted_key: bytes | None = None) -> SignedRunSpec | None:
        """The published run spec, None if there is none; RecordError if none can be trusted."""
        found = await self.dht.get(RUN_KEY, latest=True, return_future=True)
        if found is None or (isinstance(found.value, dict) and not found.value):
            return None
        if not isinstance(found.value, dict):
            raise RecordError("the run spec entry in the DHT is not a set of signed records.")
        valid, problems = [], []
        for subkey, item in found.value.items():
            try:
                record = SignedRunSpec.from_record(item.value)
                record.verify()
                _require(subkey == record.fingerprint, "the run spec is filed under another key's fingerprint.")
            except RecordError as e:
                self._skip(RUN_KEY, str(e))
                problems.append(str(e))
                continue
            valid.append(record)
        if trusted_key is not None:
            for record in valid:
                if record.public_key == bytes(trusted_key):
                    return record
            if valid:
                valid[0].verify(trusted_key)  # raises with the signer's and the trusted fingerprints
        elif len(valid) == 1:
            return valid[0]
        elif valid:
            keys = ", ".join(sorted(r.fingerprint for r in valid))
            raise RecordError(f"several keys ({keys}) publish a run spec; pin the coordinator's key with trusted_key.")
        raise RecordError(problems[0] if problems else "the DHT holds no run spec signed by the trusted key.")

    async def announce(self, ann: StageAnnouncement, ttl: float) -> bool:
        """Publish `ann` for `ttl` seconds; False if no DHT node stored it."""
        key = stage_key(ann.run_hash, ann.stage)
        return bool(
            await self.dht.store(key, ann.to_record(), get_dht_time() + ttl, subkey=ann.peer_id, return_future=True)
        )

    async def stage_peers(self, run_hash: str, stage: int) -> list[StageAnnouncement]:
        """Unexpired, well-formed announcements for one stage, sorted by peer id."""
        key = stage_key(run_hash, stage)
        found = await self.dht.get(key, latest=True, return_future=True)
        if found is None:
            return []
        if not isinstance(found.value, dict):
            self._skip(key, "the entry is a plain value, not a map of peers.")
            return []
        now, peers = get_dht_time(), []
        for subkey, item in found.value.items():
            if item.expiration_time <= now:
                continue
            try:
                ann = StageAnnouncement.from_record(item.value)
                _require(ann.peer_id == subkey, "the announcement is filed under another peer's id.")
                _require((ann.run_hash, ann.stage) == (run_hash, stage), "the announcement is filed under another key.")
            except (RecordError, TypeError) as e:
                self._skip(key, str(e))
                continue
            peers.append(ann)
        return sorted(peers, key=lambda a: a.peer_id)

    async def all_stage_peers(self, run_hash: str, n_stages: int) -> dict[int, list[StageAnnouncement]]:
        found = await asyncio.gather(*(self.stage_peers(run_hash, s) for s in range(n_stages)))
        return dict(enumerate(found))

    async def heartbeat(self, make_announcement: Callable[[], StageAnnouncement], ttl: float, period: float) -> None:
        """Re-announce every `period` seconds until cancelled, so the record outlives us by at most `ttl`."""
        if not 0 < period < ttl:
            raise ValueError(f"the heartbeat period ({period} s) must be positive and shorter than the ttl ({ttl} s).")
        while True:
            try:
                if not await self.announce(make_announcement(), ttl):
                    logger.warning("heartbeat: the DHT did not store this announcement; retrying in %g s", period)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a transient DHT failure must not end the heartbeat
                logger.warning("heartbeat failed (%s: %s); retrying in %g s", type(e).__name__, e, period)
            await asyncio.sleep(period)

    async def publish_basis(self, run_hash: str, version: int, update: bytes, ttl: float) -> bool:
        """Store one signed basis update (bytes of protocol.basis_update.encode_update)."""
        return bool(await self.dht.store(basis_key(run_hash), update, get_dht_time() + ttl, subkey=version,
                                         return_future=True))

    async def fetch_bases(self, run_hash: str) -> dict[int, bytes]:
        """Every stored basis update by version, unverified (the reader checks the signature)."""
        found = await self.dht.get(basis_key(run_hash), latest=True, return_future=True)
        if found is None or not isinstance(found.value, dict):
            return {}
        out = {}
        for subkey, item in found.value.items():
            if isinstance(subkey, int) and isinstance(item.value, bytes):
                out[subkey] = item.value
            else:
                self._skip(basis_key(run_hash), "a basis entry is not (int version -> bytes).")
        return out

    async def visible_maddrs(self) -> list[str]:
        return await self.dht.run_coroutine(_visible_maddrs, return_future=True)

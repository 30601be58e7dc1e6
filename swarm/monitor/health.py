"""Health records: what each peer tells the swarm about itself, signed, for dashboards.

Every peer publishes one small record per heartbeat under

    subspace-swarm/{run_hash}/health      subkey = peer id (base58)  -> signed HealthRecord

(the key is spelled by `swarm.dht.health_key`). A record expires after the peer's ttl
(~15 s), so a peer that dies disappears on its own. It travels in the swarm's signed
envelope (`swarm/dht/envelope.py`), signed by the peer's own libp2p identity: only the
peer whose key hashes to the peer id can write its record, a changed field breaks the
signature, and the signature covers the expiry, so an old record cannot be replayed to
live longer. Honest DHT nodes refuse anything else; `parse_health(subkey, value, expiration)`
checks it all again for readers, plus the record's own schema.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from hivemind.utils import get_dht_time

from swarm.dht import STATES, Envelope, RecordError, SwarmDHT, check_envelope, health_key
from swarm.trust.admission import AdmissionPolicy
from swarm.trust.keys import fingerprint_of

__all__ = ["REACHABILITY", "HealthRecord", "SignedHealth", "parse_health", "publish_health", "fetch_health",
           "reachability_of"]

REACHABILITY = ("direct", "relayed")
MAX_BANNED = 32  # a record lists at most this many failing peers (the most failures first)
MAX_HISTORY = 64  # and at most this many (step, loss, time) points since its previous beat
_MAX_TEXT = 128
MAX_REASON = 4 * _MAX_TEXT  # characters of a ban's reason (run_bans) and of a checkpoint error
_OPTIONAL = ("checkpoint_error",)  # fields newer than some peers: a record without them is still read


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
    # the most memory it held: torch.cuda.max_memory_allocated on a GPU, the process's peak RSS on CPU
    peak_memory_bytes: int
    uptime_s: float
    reachability: str  # one of REACHABILITY
    version: str  # software version
    refused: int  # inbound messages this peer refused
    banned: dict[str, int]  # peers this peer's router saw fail -> failures
    # replica sync (docs/algorithms.md 5): reduce bytes this peer sent to other replicas of its
    # stage (framing included, what the transport counted), and the steps it applied with them
    sync_bytes_out: int = 0
    sync_steps: int = 0
    timestamp: float = field(default_factory=get_dht_time)
    checkpoint_error: str = ""  # the last failed checkpoint write, one sentence ("": none; older peers omit it)
    # peers banned for the run (the leading head's convictions, less the swarm key's pardons) -> why ("": not told;
    # the leader knows): what `swarm status` and the dashboard list
    run_bans: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("peer_id", "run_hash", "codec", "device", "version"):
            value = getattr(self, name)
            if not (isinstance(value, str) and 0 < len(value) <= _MAX_TEXT):
                _fail(f"the health record's {name} must be a short non-empty string.")
        for name in ("stage", "step", "queue", "bytes_in", "bytes_out", "act_bytes_out", "act_tokens_out",
                     "grad_bytes_out", "grad_tokens_out", "rank", "basis_version", "basis_updated_step",
                     "memory_bytes", "peak_memory_bytes", "refused", "sync_bytes_out", "sync_steps"):
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
        if not (isinstance(self.checkpoint_error, str) and len(self.checkpoint_error) <= MAX_REASON):
            _fail("the health record's checkpoint_error must be a string of at most 512 characters.")
        if self.state not in STATES:
            _fail(f"the health record's state must be one of {', '.join(STATES)}, not {self.state!r}.")
        if self.reachability not in REACHABILITY:
            _fail(f"the health record's reachability must be one of {', '.join(REACHABILITY)}.")
        if not (isinstance(self.banned, dict) and len(self.banned) <= MAX_BANNED
                and all(isinstance(k, str) and 0 < len(k) <= _MAX_TEXT and _is_int(v) and v > 0
                        for k, v in self.banned.items())):
            _fail(f"the health record's banned must map at most {MAX_BANNED} peer ids to failure counts.")
        if not (isinstance(self.run_bans, dict) and len(self.run_bans) <= MAX_BANNED
                and all(isinstance(k, str) and 0 < len(k) <= _MAX_TEXT and isinstance(v, str)
                        and len(v) <= MAX_REASON for k, v in self.run_bans.items())):
            _fail(f"the health record's run_bans must map at most {MAX_BANNED} peer ids to a reason.")
        if not (isinstance(self.loss_history, (list, tuple)) and len(self.loss_history) <= MAX_HISTORY
                and all(isinstance(p, (list, tuple)) and len(p) == 3 and _is_int(p[0]) and p[0] >= 0
                        and _is_finite(p[1]) and _is_finite(p[2]) for p in self.loss_history)):
            _fail(f"the health record's loss_history must be at most {MAX_HISTORY} [step, loss, time] points.")
        self.loss_history = [[int(s), float(v), float(t)] for s, v, t in self.loss_history]

    @property
    def forward_bytes_per_token(self) -> float | None:
        return self.act_bytes_out / self.act_tokens_out if self.act_tokens_out else None

    @property
    def backward_bytes_per_token(self) -> float | None:
        return self.grad_bytes_out / self.grad_tokens_out if self.grad_tokens_out else None

    @property
    def sync_bytes_per_step(self) -> float | None:
        """Replica-sync bytes this peer sent per step it took with other replicas."""
        return self.sync_bytes_out / self.sync_steps if self.sync_steps else None


@dataclass(frozen=True)
class SignedHealth:
    """A health record and the envelope it came in (its signer is the peer's libp2p key)."""

    record: HealthRecord
    envelope: Envelope

    @property
    def public_key(self) -> bytes:
        return self.envelope.signer

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.envelope.signer)


def parse_health(subkey: object, value: object, expiration: float, policy: AdmissionPolicy | None = None,
                 now: float | None = None) -> SignedHealth:
    """A verified record from one DHT entry; RecordError if it is malformed, forged, misfiled or not admitted."""
    env = Envelope.from_entry(subkey, value, expiration)
    kind = check_envelope(env, get_dht_time() if now is None else now, policy or AdmissionPolicy())
    if kind.name != "health":
        _fail(f"a {kind.name} record is not a health record.")
    body = env.record()
    if not isinstance(body, dict):
        _fail(f"a health record must be a map, not {type(body).__name__}.")
    names = [f.name for f in fields(HealthRecord)]
    missing = [n for n in names if n not in body and n not in _OPTIONAL]
    if missing:
        _fail(f"the health record lacks {', '.join(missing)}.")
    try:
        # unknown keys are ignored (newer peers may add some); optional ones absent keep their defaults
        record = HealthRecord(**{n: body[n] for n in names if n in body})
    except TypeError as e:  # e.g. an unhashable key inside banned
        raise RecordError(f"the health record is malformed ({e}).") from None
    if record.peer_id != env.subkey:
        _fail("the health record is filed under another peer's id.")
    if health_key(record.run_hash) != env.key:
        _fail(f"the health record of {record.peer_id[-8:]} belongs to run {record.run_hash}, not to its key's.")
    return SignedHealth(record, env)


def reachability_of(maddrs: list[str]) -> str:
    """"relayed" if every address we are visible at goes through a relay circuit, else "direct"."""
    return "relayed" if maddrs and all("/p2p-circuit" in m for m in maddrs) else "direct"


async def publish_health(sdht: SwarmDHT, record: HealthRecord, ttl: float) -> bool:
    """Sign and store this node's record for `ttl` seconds under its peer id; False if no DHT node stored it."""
    if sdht.identity is None or record.peer_id != sdht.identity.peer_id:
        raise ValueError(f"a node publishes only its own health record, not that of {record.peer_id}.")
    return await sdht.store_own(health_key(record.run_hash), asdict(record), ttl)


async def fetch_health(sdht: SwarmDHT, run_hash: str) -> list[tuple[object, object, float]]:
    """Raw unexpired entries (subkey, value, expiration) under the run's health key; unverified (`parse_health`).

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

"""`HeldRecords`: the coordinator-signed records this node holds, so that it can re-serve them to peers that find
none in the DHT (every coordinator down for longer than the records live there: `record_share.py`), and the checks
that a record from a peer passes before it is believed.

What a node holds, and where it got it:

- the signed run spec it joined with (`SignedRunSpec`, as the coordinator published it; `swarm/node.py`
  `fetch_spec`): its own signature by the swarm key covers msgpack([domain, spec JSON, run hash]);
- the newest leader lease it read (the DHT envelope whole, since a lease is signed only through its envelope:
  `Envelope.signing_bytes` covers key, subkey, body, expiration and ticket); of two, the higher term;
- the basis updates of the run it read (`swarm/basis/sync.py`), by version, each checked there and signed by the
  swarm key itself (protocol/basis_update.py); a version read again replaces the one held (a coordinator that
  abandons a version re-signs that number);
- the work records of state and snapshot hashes that heads signed with their own libp2p identity
  (`swarm/replicas/head_vouched.py`: its own as a leading head, and those it read from peers and checked against
  the lease), by (head, what, step), the newest `WORK_STEPS` steps of each; a joiner checks a donor's state
  against them while no coordinator vouches (docs/security.md, "Without any coordinator").

Nothing expires here. A DHT expiry bounds how long a record stands in the DHT (so that its owner's next write
wins over a replay), not whether its signature holds; the swarm key signed every byte a reader relies on. So a
copy from a peer is checked for everything but its expiry:

    spec   the hash rule and the signature (`SignedRunSpec.verify`), against the pinned key when one is pinned
    lease  `check_envelope` without the expiry bound: the swarm key's signature over the envelope, filed under
           this run's lease key and the fingerprint of the adopted spec's key, signed by that key; then the body
           parsed as a `LeaderLease` of this run
    basis  by the reader, exactly as a DHT entry: the update's own signature by the spec's coordinator key
    work   by the reader: the head's signature, and that the reader's lease names the head

How a reader uses a peer's lease (`SwarmKeyRecords.fetch_lease`): only when the DHT holds none and this node holds
none; and like every lease read it never replaces one of a higher term (`Router.lease` keeps the highest).
"""
from __future__ import annotations

import msgpack

from protocol.record_wire import MAX_VERSIONS, MAX_WORK_BYTES, RecordReply
from swarm.trust.admission import AdmissionPolicy

from .envelope import Envelope, check_envelope
from .records import LeaderLease, RecordError, SignedRunSpec, _require, lease_key

__all__ = ["WORK_STEPS", "HeldRecords", "lease_from_peer", "spec_from_peer"]

# steps of head-signed records held, by what they vouch for: swarm/replicas/vouched.py's KEEP_STATES and KEEP
WORK_STEPS = {"state": 64, "snapshot": 4}


class HeldRecords:
    def __init__(self) -> None:
        self.spec: SignedRunSpec | None = None
        self.lease: tuple[Envelope, LeaderLease] | None = None
        self.bases: dict[int, bytes] = {}  # version -> a signed update's bytes (checked by the reader)
        self.work_run = ""  # the run of the work records held
        self.work: dict[tuple[str, str, int], bytes] = {}  # (head, "state" | "snapshot", step) -> a signed record

    def keep_lease(self, env: Envelope, lease: LeaderLease) -> None:
        """Hold `lease` (read and checked by the caller) unless one of a higher or the same term is held."""
        if self.lease is None or lease.term > self.lease[1].term:
            self.lease = (env, lease)

    def lease_of(self, run_hash: str) -> LeaderLease | None:
        return self.lease[1] if self.lease is not None and self.lease[1].run_hash == run_hash else None

    def keep_bases(self, updates: dict[int, bytes]) -> None:
        """Hold these checked updates (a version already held is replaced); at most MAX_VERSIONS, the newest."""
        self.bases.update(updates)
        for version in sorted(self.bases)[:-MAX_VERSIONS]:
            del self.bases[version]

    def keep_work(self, run: str, records: dict[tuple[str, str, int], bytes]) -> None:
        """Hold these checked work records of `run` (another run's are dropped); the newest `WORK_STEPS` steps of
        each kind, whoever signed them."""
        if run != self.work_run:
            self.work_run, self.work = run, {}
        self.work.update(records)
        for what, keep in WORK_STEPS.items():
            steps = sorted({t for _, w, t in self.work if w == what})
            self.work = {k: v for k, v in self.work.items() if k[1] != what or k[2] in steps[-keep:]}

    def forget_work_after(self, step: int) -> None:
        """The swarm rolls back to `step`: the records of the steps after it name bits that are driven again."""
        self.work = {k: v for k, v in self.work.items() if k[2] <= step}

    def work_of(self, run: str, max_bytes: int = MAX_WORK_BYTES - 4096) -> list[bytes]:
        """The work records of `run` held, the newest steps first, as many as fit in `max_bytes`."""
        out, size = [], 0
        for key in sorted(self.work if run == self.work_run else {}, key=lambda k: -k[2]):
            body = self.work[key]
            if size + len(body) + 8 <= max_bytes:  # msgpack's header of each bin: at most 5 bytes
                out.append(body)
                size += len(body) + 8
        return out

    def reply(self, want: str, run: str, version: int) -> RecordReply:
        """What this node holds of `want` (the empty reply: nothing)."""
        if want == "spec":
            return RecordReply(msgpack.packb(self.spec.to_record(), use_bin_type=True) if self.spec else b"")
        if want == "lease":
            if self.lease_of(run) is None:
                return RecordReply()
            env = self.lease[0]
            return RecordReply(msgpack.packb({**env.to_value(), "sk": env.subkey, "x": env.expiration},
                                             use_bin_type=True))
        if want == "work":
            records = self.work_of(run)
            return RecordReply(msgpack.packb(records, use_bin_type=True) if records else b"")
        held = self.bases if self.spec is not None and self.spec.run_hash == run else {}
        if version == 0:
            return RecordReply(versions=sorted(held))
        return RecordReply(held.get(version, b""))


def _unpack(data: bytes, what: str) -> object:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise RecordError(f"the {what} a peer sent does not decode ({type(e).__name__}).") from None


def spec_from_peer(data: bytes) -> SignedRunSpec:
    """The signed run spec in a peer's reply, its hash rule and signature checked (RecordError if not)."""
    signed = SignedRunSpec.from_record(_unpack(data, "run spec"))
    signed.verify()
    return signed


def lease_from_peer(data: bytes, run_hash: str, policy: AdmissionPolicy) -> tuple[Envelope, LeaderLease]:
    """The lease envelope in a peer's reply and its lease, checked against the adopted spec's key (`policy`) for
    everything but its expiry (RecordError if not)."""
    _require(bool(policy.swarm_key), "no coordinator key to check a lease against; adopt the run spec first.")
    value = _unpack(data, "lease")
    _require(isinstance(value, dict), "the lease a peer sent is not a map.")
    env = Envelope.from_entry(value.get("sk"), value, value.get("x"))
    _require(env.key == lease_key(run_hash), "the lease a peer sent is filed under another key.")
    check_envelope(env, 0.0, policy, bound_expiry=False)  # the swarm key's signature, its fingerprint's subkey
    try:
        lease = LeaderLease.from_record(env.record())
    except TypeError as e:
        raise RecordError(f"the lease a peer sent does not parse: {e}") from None
    _require(lease.run_hash == run_hash, "the lease a peer sent is for another run.")
    return env, lease

"""`StepRecord`: what the leading head signs for each attempt it drives, so that a peer that
holds the run's data can check it, and prove to the coordinator what the leader said.

    StepRecord  {k: "steprec", r: run, s: step, a: attempt, l: leader peer id, d: data digest,
                 p: the leader's public key (libp2p protobuf), g: signature}

    data digest = sha256( h_0 || h_1 || ... || h_{M-1} ),  h_m = sha256(token ids of microbatch m,
                  as little-endian int64), M = the spec's microbatches per step
    signed      = msgpack([STEP_RECORD_DOMAIN, r, s, a, l, d])

Every head holds the run's data and regenerates any microbatch from (data, seed, step, m)
(`peer/data/batches.py`), so any head computes the digest of a step by itself: a leader that feeds
other text than the run's, and says so in its record, is caught by the first standby head
that reads it, and the record is the proof anyone can check. (A leader that signs the run's
digest while it feeds other tokens is what recomputation catches: issue 21's spot checks
recompute a microbatch from the tokens this record commits to.) Signing and verifying take the
libp2p key, which lives in `swarm/trust/identity.py`: this file holds only the bytes.

    WorkRecord  {k: "workrec", r: run, s: steps done, l: leader, w: {stage: [peer ids that
                 contributed microbatches to that step's reduce]}, n: snapshot step, h: {stage:
                 sha256 hex of its snapshot at n}, t: state step, z: {stage: sha256 hex of its
                 replicas' agreed state after t steps}, b: the step the swarm rolled back to (-1: none), p, g}
    signed      = msgpack([WORK_RECORD_DOMAIN, r, s, l, [[stage, [ids]] sorted by stage], n,
                           [[stage, sha] sorted by stage], t, [[stage, sha] sorted by stage], b])

The leader sends one to the coordinator after each re-fit step and whenever every stage's
replicas agree on a newer snapshot: only the peers it names may vote in that re-fit
(`swarm/basis/refit.py`), so ids that merely announce a stage count for nothing there; and the
coordinator vouches for those snapshot hashes (`swarm/replicas/vouched.py`), so a peer that
restores a stage loads the snapshot the swarm took, not the one most custodians claim. After
every applied step it also sends one with the state hashes its replicas agreed on (t, z; no
workers: `peer/checks/state_votes.py` says how a hash is agreed), and the coordinator vouches for those
too, so a joiner loads only a state the swarm had. Before it rolls the swarm back from step s to b
(`peer/state/rollback.py`) it sends one with s and b: the coordinator drops what it vouched for after
b, since the steps b+1..s are driven again and need not be the same bits (issue 56, item 4).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgpack
import torch

from protocol.wire import WireError, need

STEP_RECORD_DOMAIN = "subspace-swarm/step-record/v1"
WORK_RECORD_DOMAIN = "subspace-swarm/work-record/v1"
_KIND, _WORK_KIND = "steprec", "workrec"
MAX_WORKERS = 256  # peer ids one work record may name per stage
MAX_RECORD_BYTES = 4 << 10


def unpack_record(body: bytes, max_bytes: int, kind: str, run: str, what: str) -> dict:
    """The map of a record of `kind` for `run` in `body`; WireError if it is not one."""
    need(isinstance(body, bytes) and len(body) <= max_bytes, f"a {what} must be at most {max_bytes} bytes.")
    try:
        d = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:
        raise WireError(f"a {what} is not msgpack.") from None
    need(isinstance(d, dict) and d.get("k") == kind, f"not a {what}.")
    need(d.get("r") == run, f"the {what} is for another run.")
    return d


def data_digest(microbatches: Sequence[torch.Tensor]) -> bytes:
    """The digest of one step's token ids, microbatch by microbatch (the formula above)."""
    outer = hashlib.sha256()
    for tokens in microbatches:
        ids = tokens.detach().to("cpu", torch.int64).contiguous().numpy().astype("<i8", copy=False)
        outer.update(hashlib.sha256(ids.tobytes()).digest())
    return outer.digest()


@dataclass(frozen=True)
class StepRecord:
    run: str
    step: int
    attempt: int
    leader: str
    data: bytes  # data_digest of the step's microbatches
    signer: bytes = b""  # the leader's public key, libp2p protobuf
    signature: bytes = b""

    def signing_bytes(self) -> bytes:
        return msgpack.packb([STEP_RECORD_DOMAIN, self.run, self.step, self.attempt, self.leader, self.data],
                             use_bin_type=True)

    def encode(self) -> bytes:
        return msgpack.packb({"k": _KIND, "r": self.run, "s": self.step, "a": self.attempt, "l": self.leader,
                              "d": self.data, "p": self.signer, "g": self.signature}, use_bin_type=True)

    @classmethod
    def decode(cls, body: bytes, run: str) -> StepRecord:
        """The record in `body`, for `run`; WireError if it is not one (its signature is the reader's to check)."""
        d = unpack_record(body, MAX_RECORD_BYTES, _KIND, run, "step record")
        for key in ("s", "a"):
            need(isinstance(d.get(key), int) and not isinstance(d.get(key), bool) and 0 <= d[key] < 2**53,
                 "a step record's step and attempt must be non-negative integers.")
        need(isinstance(d.get("l"), str) and 0 < len(d["l"]) <= 128, "a step record must name its leader.")
        need(isinstance(d.get("d"), bytes) and len(d["d"]) == 32, "a step record's data digest must be 32 bytes.")
        for key in ("p", "g"):
            need(isinstance(d.get(key), bytes) and len(d[key]) <= 1024, "a step record's key and signature are bytes.")
        return cls(run, d["s"], d["a"], d["l"], d["d"], d["p"], d["g"])


@dataclass(frozen=True)
class WorkRecord:
    run: str
    step: int  # steps done: the re-fit step the statistics name
    leader: str
    workers: dict[int, list[str]]  # stage -> peers that contributed microbatches to that step's reduce
    signer: bytes = b""
    signature: bytes = b""
    snapshot_step: int = 0  # the newest step at which every stage snapshotted (0: none yet)
    snapshots: dict[int, str] = field(default_factory=dict)  # stage -> its replicas' sha256 hex at snapshot_step
    state_step: int = 0  # the steps applied when the `states` were hashed (0: none in this record)
    states: dict[int, str] = field(default_factory=dict)  # stage -> the sha256 hex its replicas agreed on then
    rolled_back_to: int = -1  # the swarm rolls back from `step` to this step (-1: no rollback in this record)

    def signing_bytes(self) -> bytes:
        workers = [[s, sorted(self.workers[s])] for s in sorted(self.workers)]
        snaps = [[s, self.snapshots[s]] for s in sorted(self.snapshots)]
        states = [[s, self.states[s]] for s in sorted(self.states)]
        return msgpack.packb([WORK_RECORD_DOMAIN, self.run, self.step, self.leader, workers, self.snapshot_step,
                              snaps, self.state_step, states, self.rolled_back_to], use_bin_type=True)

    def encode(self) -> bytes:
        return msgpack.packb({"k": _WORK_KIND, "r": self.run, "s": self.step, "l": self.leader,
                              "w": {int(s): list(p) for s, p in self.workers.items()}, "p": self.signer,
                              "g": self.signature, "n": self.snapshot_step,
                              "h": {int(s): h for s, h in self.snapshots.items()}, "t": self.state_step,
                              "z": {int(s): h for s, h in self.states.items()}, "b": self.rolled_back_to},
                             use_bin_type=True)

    @classmethod
    def decode(cls, body: bytes, run: str, n_stages: int) -> WorkRecord:
        d = unpack_record(body, 64 * MAX_RECORD_BYTES, _WORK_KIND, run, "work record")
        need(isinstance(d.get("s"), int) and not isinstance(d.get("s"), bool) and 0 < d["s"] < 2**53,
             "a work record's step must be a positive integer.")
        need(isinstance(d.get("l"), str) and 0 < len(d["l"]) <= 128, "a work record must name its leader.")
        w = d.get("w")
        need(isinstance(w, dict) and all(isinstance(s, int) and 0 <= s < n_stages for s in w),
             "a work record's workers must be keyed by stage.")
        need(all(isinstance(p, list) and len(p) <= MAX_WORKERS and all(isinstance(x, str) and 0 < len(x) <= 128
                                                                       for x in p) for p in w.values()),
             "a work record's workers must be lists of peer ids.")
        for key in ("p", "g"):
            need(isinstance(d.get(key), bytes) and len(d[key]) <= 1024, "a work record's key and signature are bytes.")
        n, h = d.get("n", 0), d.get("h", {})
        need(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= d["s"], "a work record's snapshot step "
             "must be a step it has done.")
        t, z = d.get("t", 0), d.get("z", {})
        need(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= d["s"], "a work record's state step "
             "must be a step it has done.")
        b = d.get("b", -1)
        need(isinstance(b, int) and not isinstance(b, bool) and -1 <= b < d["s"], "a work record's rollback "
             "step must be before its step.")
        for hashes, what in ((h, "snapshots"), (z, "states")):
            need(isinstance(hashes, dict) and all(isinstance(s, int) and 0 <= s < n_stages and isinstance(x, str)
                                                  and len(x) == 64 for s, x in hashes.items()),
                 f"a work record's {what} must map stages to sha256 hex.")
        return cls(run, d["s"], d["l"], {s: list(p) for s, p in w.items()}, d["p"], d["g"], n, dict(h), t, dict(z),
                   b)

"""The state-transfer messages (kind `state`): a joining replica downloads a stage's state from a
donor, its description first, then chunk by chunk (peer/state/state_transfer.py); validated on the way
in like wire.py.

    StateRequest  {k: "state", r, o: "meta" | "now" | "chunk", i: chunk index, n: snapshot id}
                  "meta": a joiner's: where the swarm records state hashes, a state at a step they will vouch
                  for (the donor waits for one); "now": an exporter's: the state as it is
    StateMeta     {k: "statem", s: step, n: snapshot id, z: total bytes, c: chunk bytes, h: sha256 hex}

Then (kind `fol`) its donor forwards it every step's reduced gradient until it reduces itself:

    FollowUpdate  {k: "fol", r, s, t: reduced flat gradient, q: reduced statistic | nil, j: in layout, v: skip,
                   f: [exact sum, P sum, Q sum] | absent}
                  the reduced gradient of step s (compute dtype): in the stage's `SyncLayout` (j true),
                  or, from a replica that was alone in its reduce, every parameter's gradient in full
                  (j false); v: skipped, t q nil. A powersgd step travels as the sums its replicas
                  rebuilt the gradient from (f, compute dtype, t nil, j true): the exact part, P and
                  Q' of docs/algorithms.md 5.2, about two contributions' bytes (the sums in the compute
                  dtype, the factors travel in the wire dtype) instead of the stage's whole gradient:
                  0.8-1.0 MB against 26-38 MB a step at `small`, 9-11 MB against 1.1-1.6 GB at `large`
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgpack
import torch

from protocol.fields import check_run, flag_field, int_field, opt_tensor, same, unpack_map, with_flag
from protocol.flat_limits import FlatLimits, flat_tensor, stat_tensor
from protocol.wire import KIND_FOLLOW, KIND_STATE, need

STATE_OPS = ("meta", "now", "chunk")
STATE_CHUNK_BYTES = 8 << 20
_STATE_META = "statem"


@dataclass
class StateRequest:
    run: str
    op: str
    index: int = 0
    snapshot: int = 0


@dataclass
class StateMeta:
    step: int
    snapshot: int
    total_bytes: int
    chunk_bytes: int
    sha256: str


def encode_state_request(r: StateRequest) -> bytes:
    return msgpack.packb({"k": KIND_STATE, "r": r.run, "o": r.op, "i": r.index, "n": r.snapshot})


def decode_state_request(data: bytes, run: str) -> StateRequest:
    d = unpack_map(data, 4096, "a state request")
    need(same(d.get("k"), KIND_STATE), "not a state request.")
    check_run(d, run, "the state request")
    need(d.get("o") in STATE_OPS, f"a state request's op must be one of {', '.join(STATE_OPS)}.")
    return StateRequest(run, d["o"], int_field(d, "i", "chunk index", 2**31), int_field(d, "n", "snapshot id", 2**63))


def encode_state_meta(m: StateMeta) -> bytes:
    return msgpack.packb({"k": _STATE_META, "s": m.step, "n": m.snapshot, "z": m.total_bytes, "c": m.chunk_bytes,
                          "h": m.sha256})


def decode_state_meta(data: bytes, max_total: int) -> StateMeta:
    d = unpack_map(data, 4096, "a state description")
    need(same(d.get("k"), _STATE_META), "not a state description.")
    total, chunk = int_field(d, "z", "state size", max_total + 1), int_field(d, "c", "chunk size", 1 << 30)
    need(chunk > 0, "the chunk size must be positive.")
    need(isinstance(d.get("h"), str) and len(d["h"]) == 64, "the state's sha256 must be 64 hex digits.")
    return StateMeta(int_field(d, "s", "step"), int_field(d, "n", "snapshot id", 2**63), total, chunk, d["h"])


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FollowUpdate:
    run: str
    step: int
    grads: torch.Tensor | None  # None only when `skip`
    stat: torch.Tensor | None = None
    in_layout: bool = False  # grads in the stage's SyncLayout, else in full
    skip: bool = False  # fp16: the swarm skipped this step
    factors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # powersgd: (exact, P, Q') sums


def encode_follow(f: FollowUpdate) -> bytes:
    d = with_flag({"k": KIND_FOLLOW, "r": f.run, "s": f.step, "t": opt_tensor(f.grads), "q": opt_tensor(f.stat),
                   "j": f.in_layout}, "v", f.skip)
    if f.factors is not None:
        d["f"] = [opt_tensor(t) for t in f.factors]
    return msgpack.packb(d)


def decode_follow(data: bytes, lim: FlatLimits) -> FollowUpdate:
    d = unpack_map(data, lim.max_bytes, "a follow update")
    need(same(d.get("k"), KIND_FOLLOW), "not a follow update.")
    check_run(d, lim.run, "the follow update")
    j = d.get("j", False)
    need(isinstance(j, bool), "a follow update's j must be true or false.")
    if flag_field(d, "v", "a follow update's skip flag"):
        need(d.get("t") is None and d.get("q") is None and "f" not in d,
             "a skipped step's follow update carries no tensors.")
        return FollowUpdate(lim.run, int_field(d, "s", "step"), None, None, j, skip=True)
    numel, step = lim.numel if j else (lim.full_numel or lim.numel), int_field(d, "s", "step")
    if "f" in d:
        phases = lim.at(step).phases
        need(len(phases) == 2, "this stage sums this step exactly: a follow update of it carries no factors.")
        need(d.get("t") is None and j is True, "a follow update in factors carries no flat gradient.")
        f = d["f"]
        need(isinstance(f, list) and len(f) == 3, "a follow update's factors must be [exact, P, Q] sums.")
        sizes = (phases[0][0], phases[0][1], phases[1][1])
        sums = tuple(flat_tensor(t, lim, f"the follow update's {what} sum", n)
                     for t, what, n in zip(f, ("exact", "P", "Q"), sizes))
        return FollowUpdate(lim.run, step, None, stat_tensor(d.get("q"), lim.at(step)), True, factors=sums)
    return FollowUpdate(lim.run, step, flat_tensor(d.get("t"), lim, "the reduced gradient", numel),
                        stat_tensor(d.get("q"), lim.at(step)), j)

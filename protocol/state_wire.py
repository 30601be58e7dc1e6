"""The state-transfer messages (kind `state`): a joining replica downloads a stage's state from a
donor, its description first, then chunk by chunk (peer/state_transfer.py); validated on the way
in like wire.py.

    StateRequest  {k: "state", r, o: "meta" | "chunk", i: chunk index, n: snapshot id}
    StateMeta     {k: "statem", s: step, n: snapshot id, z: total bytes, c: chunk bytes, h: sha256 hex}
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgpack

from .control import _int, _is, _run, _unpack
from .wire import KIND_STATE, _need

STATE_OPS = ("meta", "chunk")
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
    d = _unpack(data, 4096, "a state request")
    _need(_is(d.get("k"), KIND_STATE), "not a state request.")
    _run(d, run, "the state request")
    _need(d.get("o") in STATE_OPS, f"a state request's op must be one of {', '.join(STATE_OPS)}.")
    return StateRequest(run, d["o"], _int(d, "i", "chunk index", 2**31), _int(d, "n", "snapshot id", 2**63))


def encode_state_meta(m: StateMeta) -> bytes:
    return msgpack.packb({"k": _STATE_META, "s": m.step, "n": m.snapshot, "z": m.total_bytes, "c": m.chunk_bytes,
                          "h": m.sha256})


def decode_state_meta(data: bytes, max_total: int) -> StateMeta:
    d = _unpack(data, 4096, "a state description")
    _need(_is(d.get("k"), _STATE_META), "not a state description.")
    total, chunk = _int(d, "z", "state size", max_total + 1), _int(d, "c", "chunk size", 1 << 30)
    _need(chunk > 0, "the chunk size must be positive.")
    _need(isinstance(d.get("h"), str) and len(d["h"]) == 64, "the state's sha256 must be 64 hex digits.")
    return StateMeta(_int(d, "s", "step"), _int(d, "n", "snapshot id", 2**63), total, chunk, d["h"])


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

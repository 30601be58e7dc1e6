"""Snapshot messages (kind `snap`): a stage's state at a step boundary, kept by peers of other
stages so that a stage whose every replica died can be restored (peer/state/snapshots.py).

Maps (short keys), validated on the way in like wire.py:

    SnapshotRequest  {k: "snap", r: run, o: op, g: stage, s: step, i: chunk index, h: sha256 hex, z: bytes}
                     op "offer": the sender holds stage g's snapshot at step s (z bytes, sha256 h) and
                        asks the receiver to keep a copy: the receiver fetches it in chunks from the
                        sender, checks it against h, and keeps it (reply: an ACK, or a refusal);
                     op "list": which snapshots of stage g the receiver holds (reply: SnapshotList);
                     op "chunk": chunk i of the receiver's snapshot of stage g at step s (reply: the bytes)
    SnapshotList     {k: "snapl", s: the responder's own step, t: whether its stage's state was restored
                      from a snapshot and no step applied since, x: [[step, sha256 hex, bytes], ...]}

A chunk is `CHUNK_BYTES` long, the last one shorter; a snapshot of zero bytes has one empty chunk.
Chunks are small (64 KiB: 6.6 ms at 80 Mbit/s, 0.5 s at 1 Mbit/s) because a snapshot shares the
holder's one uplink with training: between two chunks the activations and gradients it sends get
their turn, and one that waits behind a chunk waits at most a chunk's time (1 MiB chunks held a
1 Mbit/s head's activations for 8 s, past their deadline, and got a healthy replica banned).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from protocol.fields import int_field, same, unpack_map
from protocol.wire import KIND_SNAPSHOT, need

SNAPSHOT_OPS = ("offer", "list", "chunk")
CHUNK_BYTES = 1 << 16
MAX_LISTED = 16  # snapshots of one stage a peer lists at most
_LIST = "snapl"


@dataclass(frozen=True)
class SnapshotInfo:
    step: int
    sha256: str
    size: int


@dataclass
class SnapshotRequest:
    run: str
    op: str
    stage: int
    step: int = 0
    index: int = 0
    sha256: str = ""
    size: int = 0


@dataclass
class SnapshotList:
    step: int  # the responder's own step (the step its stage is on)
    held: list[SnapshotInfo] = field(default_factory=list)
    restored: bool = False  # its state is a snapshot it restored, and it applied no step since


def n_chunks(size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    return max(1, -(-size // chunk_bytes))


def _sha(v: object) -> str:
    need(isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v),
         "a snapshot's sha256 must be 64 lowercase hex digits.")
    return v


def encode_snapshot_request(r: SnapshotRequest) -> bytes:
    return msgpack.packb({"k": KIND_SNAPSHOT, "r": r.run, "o": r.op, "g": r.stage, "s": r.step, "i": r.index,
                          "h": r.sha256, "z": r.size})


def decode_snapshot_request(data: bytes, run: str, n_stages: int, max_bytes: int) -> SnapshotRequest:
    d = unpack_map(data, 4096, "a snapshot request")
    need(same(d.get("k"), KIND_SNAPSHOT), "not a snapshot request.")
    need(same(d.get("r"), run), "the snapshot request is for another run.")
    need(d.get("o") in SNAPSHOT_OPS, f"a snapshot request's op must be one of {', '.join(SNAPSHOT_OPS)}.")
    r = SnapshotRequest(run, d["o"], int_field(d, "g", "stage", n_stages), int_field(d, "s", "step"),
                        int_field(d, "i", "chunk index", 2**31))
    if r.op == "offer":
        r.sha256, r.size = _sha(d.get("h")), int_field(d, "z", "snapshot size", max_bytes + 1)
    return r


def encode_snapshot_list(m: SnapshotList) -> bytes:
    return msgpack.packb({"k": _LIST, "s": m.step, "t": m.restored, "x": [[i.step, i.sha256, i.size] for i in m.held]})


def decode_snapshot_list(data: bytes, max_bytes: int) -> SnapshotList:
    d = unpack_map(data, 8192, "a snapshot list")
    need(same(d.get("k"), _LIST), "not a snapshot list.")
    x = d.get("x")
    need(isinstance(x, list) and len(x) <= MAX_LISTED and all(isinstance(e, list) and len(e) == 3 for e in x),
         f"a snapshot list must hold at most {MAX_LISTED} [step, sha256, bytes] entries.")
    held = [SnapshotInfo(int_field({"s": e[0]}, "s", "a snapshot's step"), _sha(e[1]),
                         int_field({"z": e[2]}, "z", "a snapshot's size", max_bytes + 1)) for e in x]
    need(isinstance(d.get("t", False), bool), "a snapshot list's t must be true or false.")
    return SnapshotList(int_field(d, "s", "step"), held, d.get("t", False))

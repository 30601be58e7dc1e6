"""Spot checks (issue 21): the records that let one replica's work be recomputed by another,
and the messages that carry them. Validated on the way in like control.py (protocol/fields.py).

A replica's contribution to a reduce is the sum of its microbatches' gradients, a function of
the stage's state (the same on every replica) and of each microbatch's inputs: the activation
that came from upstream and, below the last stage, the gradient that came back from downstream.
So every peer keeps the boundary messages of the attempt in progress (peer/daemon/boundary_log.py) and
reports, in its reduce reply, a digest of every message it SENT and to whom (`Sent`), and of every
activation it RECEIVED and from whom. The leader thereby knows, from the senders and not from the
replica checked, what each replica's inputs were; and for a head (stage 0, whose input is the tokens
that any head regenerates from (seed, step, index)), from the stage-1 receivers, what it sent on.
A check (`CheckOrder`, in the leader's command to a checking replica of the same stage) names
the replica checked, its microbatches and those digests; the checker asks it for the
message bodies (`InputsRequest`/`InputsReply`), refuses any whose digest differs, recomputes the
share and compares it with the contribution it received in the reduce.

Maps (short keys):

    Sent          [kind, microbatch, to, digest(, signature)]   kind "a" (activation) or "g" (gradient)
                                                   sent to `to`, or "r" / "q": an activation / a gradient
                                                   received from `to`, with `to`'s signature of it
                                                   (protocol/boundary_sig.py: the sender's evidence)
    CheckOrder    {t: target peer id, m: [microbatches], i: [[activation digest, gradient digest | nil], ...]}
    InputsRequest {k: "redi", r: run, s: step, a: attempt, g: stage, m: [microbatches]}   (over `red`)
    InputsReply   {k: "redir", b: [[activation body, gradient body | nil], ...]}   in the request's order

digest(body) = the first 16 bytes of sha256(body): the bytes as they went over the wire.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgpack

from protocol.boundary_sig import MAX_SIGNATURE
from protocol.fields import MAX_GROUP, check_run, int_field, microbatch_list, peer_id, unpack_map
from protocol.wire import WireError, need

DIGEST_BYTES = 16
# activation (sent downstream), gradient (sent upstream), activation received, gradient received
KINDS = ("a", "g", "r", "q")
RECEIVED = {"r": "a", "q": "g"}  # a receiver's report -> the kind of its sender's report of the same message
_REQUEST, _REPLY = "redi", "redir"


def digest(body: bytes) -> bytes:
    return hashlib.sha256(body).digest()[:DIGEST_BYTES]


@dataclass(frozen=True)
class Sent:
    """A boundary message this peer sent in the attempt: to whom, and a digest of its bytes (kinds "r" and
    "q": an activation or a gradient it received, `to` naming its sender, `sig` its sender's signature)."""

    kind: str
    microbatch: int
    to: str
    digest: bytes
    sig: bytes = b""


@dataclass(frozen=True)
class CheckOrder:
    """The leader's order to recompute `target`'s share of the reduce from the inputs whose digests
    its senders reported: per microbatch (activation digest, gradient digest or None on the last stage)."""

    target: str
    microbatches: list[int]
    inputs: list[tuple[bytes, bytes | None]]


@dataclass(frozen=True)
class InputsRequest:
    run: str
    step: int
    attempt: int
    stage: int
    microbatches: list[int]


def _digest(v: object) -> bytes:
    need(isinstance(v, bytes) and len(v) == DIGEST_BYTES, f"a digest must be {DIGEST_BYTES} bytes.")
    return v


def encode_sent(sent: list[Sent]) -> list:
    return [[s.kind, s.microbatch, s.to, s.digest] + ([s.sig] if s.sig else []) for s in sent]


def decode_sent(v: object, n_microbatches: int) -> list[Sent]:
    need(isinstance(v, list) and len(v) <= 4 * n_microbatches * MAX_GROUP, "a sent list must be a short list.")
    out = []
    for e in v:
        need(isinstance(e, list) and len(e) in (4, 5) and e[0] in KINDS,
             "a sent entry must be [kind, mb, to, digest(, signature)].")
        sig = e[4] if len(e) == 5 else b""
        need(isinstance(sig, bytes) and len(sig) <= MAX_SIGNATURE, "a sent entry's signature must be short bytes.")
        out.append(Sent(e[0], microbatch_list([e[1]], n_microbatches)[0], peer_id(e[2]), _digest(e[3]), sig))
    return out


def encode_order(o: CheckOrder) -> bytes:
    return msgpack.packb({"t": o.target, "m": o.microbatches, "i": [list(i) for i in o.inputs]})


def decode_order(data: bytes, n_microbatches: int) -> CheckOrder:
    d = unpack_map(data, 64 << 10, "a check order", max_bin=DIGEST_BYTES)
    mbs = microbatch_list(d.get("m"), n_microbatches)
    need(len(mbs) > 0, "a check order names at least one microbatch.")
    i = d.get("i")
    need(isinstance(i, list) and len(i) == len(mbs) and all(isinstance(e, list) and len(e) == 2 for e in i),
         "a check order carries one [activation, gradient] digest pair per microbatch.")
    inputs = [(_digest(a), None if g is None else _digest(g)) for a, g in i]
    return CheckOrder(peer_id(d.get("t")), mbs, inputs)


def encode_inputs_request(r: InputsRequest) -> bytes:
    return msgpack.packb({"k": _REQUEST, "r": r.run, "s": r.step, "a": r.attempt, "g": r.stage, "m": r.microbatches})


def is_inputs_request(d: dict) -> bool:
    return d.get("k") == _REQUEST


def inputs_request(d: dict, run: str, stage: int, n_microbatches: int) -> InputsRequest:
    """The request in an unpacked `red` message (`is_inputs_request`)."""
    check_run(d, run, "the inputs request")
    need(d.get("g") == stage and not isinstance(d.get("g"), bool),
         f"the inputs request is not for stage {stage}, which this replica serves.")
    return InputsRequest(run, int_field(d, "s", "step"), int_field(d, "a", "attempt", 2**31), stage,
                         microbatch_list(d.get("m"), n_microbatches))


def encode_inputs_reply(bodies: list[tuple[bytes, bytes | None]]) -> bytes:
    return msgpack.packb({"k": _REPLY, "b": [list(b) for b in bodies]})


def decode_inputs_reply(data: bytes, n: int, max_bytes: int) -> list[tuple[bytes, bytes | None]]:
    """The `n` (activation, gradient) bodies of an `InputsReply`; WireError if it is not one."""
    try:
        d = msgpack.unpackb(bytes(data), raw=False, max_bin_len=max_bytes, max_array_len=max(n, 2),
                            max_map_len=4, max_str_len=16)
    except Exception as e:  # any malformed bytes mean the same
        raise WireError(f"an inputs reply is not valid msgpack ({type(e).__name__}).") from None
    need(isinstance(d, dict) and d.get("k") == _REPLY, "not an inputs reply.")
    b = d.get("b")
    need(isinstance(b, list) and len(b) == n and all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], bytes) and (e[1] is None or isinstance(e[1], bytes))
        for e in b), f"an inputs reply carries {n} [activation, gradient] body pairs.")
    return [(a, g) for a, g in b]


__all__ = ["CheckOrder", "InputsRequest", "Sent", "digest", "encode_order", "decode_order", "encode_sent",
           "decode_sent", "encode_inputs_request", "inputs_request", "is_inputs_request", "encode_inputs_reply",
           "decode_inputs_reply"]

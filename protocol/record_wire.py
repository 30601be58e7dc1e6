"""Record messages (kind `rec`): a peer asks another for a coordinator-signed record that the other holds, so that
a swarm whose every coordinator is down still lets newcomers join (swarm/dht/record_share.py).

The records themselves are opaque here: each carries its own proof (the swarm key's signature over the run spec,
over a basis update, or over the lease's DHT envelope), which the asker checks; this module only bounds and
shapes the bytes. Maps (short keys), validated on the way in like wire.py:

    RecordRequest  {k: "rec", w: what ("spec" | "lease" | "basis" | "work"), r: run hash ("" for the spec, which
                    the asker does not know yet), v: a basis version (0: list the versions held), t: the asker's
                    admission ticket (bytes, empty in a public swarm: a private swarm serves ticket holders only,
                    and a newcomer asks before any announcement of its own carries its ticket)}
    RecordReply    {k: "recs", d: the record's bytes (empty: none held), n: basis versions held (the list, for v = 0)}

"work" asks for the leading heads' signed work records of their state and snapshot hashes (protocol/step_record.py,
signed with the head's libp2p identity, not the swarm key: the asker checks the signature and that the lease names
the head, swarm/replicas/head_vouched.py); its `d` is a msgpack list of encoded records, at most `MAX_WORK_BYTES`.

A request is at most `MAX_REQUEST_BYTES`; a reply at most the bound the asker gives (`reply_limit`): the spec's
`MAX_SPEC_BYTES`, a lease's `MAX_LEASE_BYTES`, or one basis update (d x k float32 and its header). A refusal is
an `ErrorReply` (wire.py), which `decode_record_reply` raises as a WireError with the server's sentence.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from protocol.fields import int_field, same, unpack_map
from protocol.wire import KIND_ERROR, KIND_RECORDS, WireError, need

__all__ = ["KIND_RECORDS", "MAX_LEASE_BYTES", "MAX_REQUEST_BYTES", "MAX_SPEC_BYTES", "MAX_VERSIONS", "MAX_WORK_BYTES",
           "WANTS",
           "RecordReply", "RecordRequest", "decode_record_reply", "decode_record_request", "encode_record_reply",
           "encode_record_request", "reply_limit"]

WANTS = ("spec", "lease", "basis", "work")
_REPLY = "recs"
MAX_TICKET_BYTES = 512  # swarm/trust/admission.py's bound on a ticket
MAX_REQUEST_BYTES = 1024 + MAX_TICKET_BYTES
MAX_SPEC_BYTES = 256 << 10  # a signed run spec: its JSON (~0.7-1 KB for every preset) with room for a long `extra`
MAX_LEASE_BYTES = 64 << 10  # a lease's envelope: at most 256 heads and 1024 revoked ids of <= 128 characters
# the heads' work records one reply carries: 64 state records of 8 stages are ~60 KB; snapshot records name workers
MAX_WORK_BYTES = 512 << 10
MAX_VERSIONS = 4096  # basis versions one reply lists (a re-fit every 500 steps: two million steps)
_MAX_VERSION = 10**9  # swarm/dht/records.py's basis subkey: at most 9 digits


@dataclass(frozen=True)
class RecordRequest:
    want: str
    run: str = ""
    version: int = 0
    ticket: bytes = b""


@dataclass(frozen=True)
class RecordReply:
    record: bytes = b""  # empty: this peer holds none
    versions: list[int] = field(default_factory=list)


def reply_limit(want: str, basis_bytes: int = 0) -> int:
    """The largest reply an asker reads for `want`: bytes of the record plus the map around it (`basis_bytes`:
    one basis update's, d x k x 4 plus its header, for "basis")."""
    record = {"spec": MAX_SPEC_BYTES, "lease": MAX_LEASE_BYTES, "work": MAX_WORK_BYTES}.get(want, basis_bytes)
    return max(record, 9 * MAX_VERSIONS) + 4096  # a list of versions: up to 9 bytes each (msgpack uint64)


def encode_record_request(r: RecordRequest) -> bytes:
    return msgpack.packb({"k": KIND_RECORDS, "w": r.want, "r": r.run, "v": r.version, "t": r.ticket})


def decode_record_request(data: bytes) -> RecordRequest:
    d = unpack_map(data, MAX_REQUEST_BYTES, "a record request", max_bin=MAX_TICKET_BYTES)
    need(same(d.get("k"), KIND_RECORDS), "not a record request.")
    want, run, ticket = d.get("w"), d.get("r", ""), d.get("t", b"")
    need(isinstance(want, str) and want in WANTS, f"a record request asks for one of {', '.join(WANTS)}.")
    need(isinstance(run, str) and len(run) <= 128 and (want == "spec" or run),
         "a record request names the run (its hash) of a lease, a basis update or work records.")
    need(isinstance(ticket, bytes), "a record request's ticket must be bytes.")
    return RecordRequest(want, run, int_field(d, "v", "a basis version", _MAX_VERSION), ticket)


def encode_record_reply(r: RecordReply) -> bytes:
    return msgpack.packb({"k": _REPLY, "d": r.record, "n": list(r.versions)})


def decode_record_reply(data: bytes, max_bytes: int) -> RecordReply:
    """The reply in `data` (at most `max_bytes`); WireError with the server's sentence if it refused."""
    d = unpack_map(data, max_bytes, "a record reply", max_bin=max_bytes)
    if same(d.get("k"), KIND_ERROR):
        reason = d.get("e")
        raise WireError(f"the peer refused: {reason[:500] if isinstance(reason, str) else '(no reason)'}")
    need(same(d.get("k"), _REPLY), "not a record reply.")
    record, versions = d.get("d", b""), d.get("n", [])
    need(isinstance(record, bytes), "a record reply's record must be bytes.")
    need(isinstance(versions, list) and len(versions) <= MAX_VERSIONS
         and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < _MAX_VERSION for v in versions),
         f"a record reply lists at most {MAX_VERSIONS} basis versions, each a positive integer.")
    return RecordReply(record, sorted(set(versions)))


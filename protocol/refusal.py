"""Signed refusals of a reduce command (issue 57): a head that will not sum with the leading head says so under its
own signature, so that the leader can prove the refusal to the coordinator.

A head refuses a reduce command only when the leader's step record it carries does not check out
(swarm/replicas/data_check.py `StepRecordCheck`: missing, malformed, for another step or attempt, not signed by
the leader it names, or a data digest that is not the head's own). Its reply then carries its signature of

    statement = msgpack([REFUSAL_DOMAIN, run hash, step, attempt, sha256(the step record's bytes), reason[:500]])

made with its peer identity, the key that signs its boundary messages (protocol/boundary_sig.py: the `Signer` of
its link, swarm/trust/boundary_signer.py), in `CommandReply.refusal`. The step record is the only part of the
command its leader signs, so it is what the refusal names; the reason is the reply's own (cut to 500 characters).

The leader that names the refuser (peer/step/redrive_cause.py) sends the coordinator the evidence:

    RefusalReport  {k: "refrep", r: run, p: refuser peer id, d: the step record's bytes, e: reason, g: signature}

The step and attempt are the record's: a refusal signed over others does not verify. An honest head on the run's
data never refuses a genuine record (signed by its leader, for its command's step and attempt, its digest the
run's), so a report whose record is genuine and whose signature is the refuser's proves that the refuser reads
other data than the run's, or lies (the coordinator's verdict: swarm/replicas/refusal_verdict.py).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgpack

from protocol.boundary_sig import MAX_SIGNATURE
from protocol.step_record import MAX_RECORD_BYTES, unpack_record
from protocol.wire import need

REFUSAL_DOMAIN = "subspace-swarm/reduce-refusal/v1"
MAX_REASON = 500  # the reply's reason is cut to this (protocol/control.py `encode_reply`)
_KIND = "refrep"


def statement(run: str, step: int, attempt: int, record: bytes, reason: str) -> bytes:
    """The bytes a head signs when it refuses the reduce command of (step, attempt) that carried `record`."""
    return msgpack.packb([REFUSAL_DOMAIN, run, int(step), int(attempt), hashlib.sha256(bytes(record)).digest(),
                          reason[:MAX_REASON]], use_bin_type=True)


@dataclass(frozen=True)
class RefusalReport:
    run: str
    refuser: str  # the head that refused
    record: bytes  # the leader's encoded, signed StepRecord the refused command carried
    reason: str  # the refuser's reason, as its reply said it
    signature: bytes  # the refuser's signature of `statement` (its link signer's form)

    def encode(self) -> bytes:
        return msgpack.packb({"k": _KIND, "r": self.run, "p": self.refuser, "d": self.record,
                              "e": self.reason[:MAX_REASON], "g": self.signature}, use_bin_type=True)

    @classmethod
    def decode(cls, body: bytes, run: str) -> RefusalReport:
        """The report in `body`, for `run`; WireError if it is not one (its signatures are the reader's to check)."""
        d = unpack_record(body, 2 * MAX_RECORD_BYTES, _KIND, run, "refusal report")
        need(isinstance(d.get("p"), str) and 0 < len(d["p"]) <= 128, "a refusal report must name the refuser.")
        need(isinstance(d.get("d"), bytes) and len(d["d"]) <= MAX_RECORD_BYTES,
             "a refusal report's step record must be a few bytes.")
        need(isinstance(d.get("e"), str) and len(d["e"]) <= MAX_REASON, "a refusal report's reason must be short.")
        need(isinstance(d.get("g"), bytes) and 0 < len(d["g"]) <= MAX_SIGNATURE,
             "a refusal report must carry the refuser's signature.")
        return cls(run, d["p"], d["d"], d["e"], d["g"])

    def statement(self, step: int, attempt: int) -> bytes:
        """What the refuser signed, if it refused this record at (step, attempt)."""
        return statement(self.run, step, attempt, self.record, self.reason)

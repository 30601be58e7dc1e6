"""`RefusalVerdict`: the coordinator's judge of a head's signed refusal of the leading head's reduce (issue 57),
served on KIND_REFUSAL_REPORT.

A head that refuses to sum with an honest leader and reports nothing makes the leader's attempts fail; the
leader names it after 3 (peer/step/redrive_cause.py) and sends the coordinator the refuser's signed refusal with
the step record it refused (protocol/refusal.py `RefusalReport`). The coordinator bans the refuser for the run
(`DataVerdict.revoke`, as a caught liar: its lease is revoked, and every router leaves it out, `Router.is_banned`)
only if all of these hold:

    the report decodes, and its sender is the leader its record names;
    the record is signed by that leader (`signed_by_leader`) and its data digest is the run's, by the
        coordinator's own copy of the data (`DataVerdict.runs_data`): the record is genuine;
    verify(refuser, statement(run, record.step, record.attempt, record, reason), signature): the refuser signed
        that it refused this very record at its step and attempt;
    the refuser is a head now (announced on stage 0, or in the lease), not the leader itself.

An honest head on the run's data never refuses a genuine record, so together they prove that the refuser reads
other data than the run's, or lies: the same proof, and the same end, as a head's data report that does not hold
(`DataVerdict.on_report`). Anything less bans nobody, since the leader may be the liar and its word alone proves
nothing: a refusal forged or altered (its signature does not verify), a record not signed by its leader, or one
whose data is not the run's (then the refuser was right, and bans nobody here). No rollback: a refuser summed
nothing of the steps it refused, so nothing of it was applied.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from protocol.refusal import RefusalReport
from protocol.step_record import StepRecord
from protocol.wire import ErrorReply, WireError, encode_message
from swarm.trust.boundary_signer import verify_peer
from swarm.trust.signed_records import signed_by_leader

from .data_check import DataVerdict

log = logging.getLogger(__name__)


def _no(reason: str) -> bytes:
    return encode_message(ErrorReply(reason))


class RefusalVerdict:
    """Bans a head for the run on its signed refusal of a genuine step record, and on nothing less."""

    def __init__(self, data: DataVerdict, verify: Callable[[str, bytes, bytes], bool] = verify_peer,
                 record_signed: Callable[[StepRecord], bool] = signed_by_leader) -> None:
        self.data = data  # the run's data, the heads, the revocations so far, and `revoke`
        self.verify, self.record_signed = verify, record_signed
        self.banned = 0  # refusers banned on this coordinator's verdict

    async def on_report(self, body: bytes, sender: str) -> bytes:
        """b"" when the refuser is banned (or was already); otherwise an ErrorReply that says why not."""
        try:
            report = RefusalReport.decode(body, self.data.run_hash)
            record = StepRecord.decode(report.record, self.data.run_hash)
        except WireError as e:
            return _no(str(e))
        refuser = report.refuser
        if sender != record.leader or refuser == record.leader:
            return _no("only the leader whose step record was refused reports the refusal, and of another head.")
        if not self.record_signed(record):
            return _no("the refused step record is not signed by the leader it names.")
        if not self.verify(refuser, report.statement(record.step, record.attempt), report.signature):
            return _no("the refusal is not signed by the head it names, for that step record.")
        if refuser in self.data.revoked:
            return b""
        if not await self.data.runs_data(record):
            log.warning("head %s reported head %s's refusal of its step %d, but its own record says it fed other "
                        "data than the run's: the refusal was right, and nobody is banned for it", sender[-8:],
                        refuser[-8:], record.step + 1)
            return _no("the refused step record's data is not the run's: the refusal was right.")
        if self.data.heads is None or refuser not in await self.data.heads():
            log.warning("peer %s refused head %s's genuine reduce of step %d, but it is no head: nobody is banned",
                        refuser[-8:], sender[-8:], record.step + 1)
            return _no("the refuser is not a head of this swarm.")
        self.data.revoked.add(refuser)
        self.banned += 1
        log.error("head %s refused head %s's reduce of step %d (attempt %d), whose data is the run's, under its own "
                  "signature ('%s'): it reads other data than the run's (or lies); its lease is revoked and the swarm "
                  "leaves it out for the run", refuser[-8:], sender[-8:], record.step + 1, record.attempt,
                  report.reason[:120])
        await self.data.revoke(refuser, f"refused the run's data of step {record.step + 1} from an honest leader",
                               None, 0)
        return b""

"""Who lies about a boundary message, from evidence (issue 57; the leader's side, peer/checks/spot_checks.py).

Every boundary message is reported twice in the reduce replies (protocol/spot_check.py `Sent`): by its
sender ("a" for an activation, "g" for a gradient: a digest of what it sent, and to whom) and by its
receiver ("r", "q": a digest of what it got, from whom, and the sender's signature of it,
protocol/boundary_sig.py, which the receiver checked before it took the message). So where the two ends
of one message disagree, the signature says which one lies, and anyone holding the two reports can
check it (the sender's key is named by its peer id):

    the receiver's report carries a valid sender signature over its digest  ->  the sender lies: it signed
        one message and reports another (an honest sender reports the bytes it signed)
    it does not                                                             ->  the receiver lies: it
        reports bytes its sender never signed (an honest receiver refuses an unsigned message)

A receiver's report is also what a head's share is checked against (its input is the tokens; what it
sent on, stage 1 reports), so such a report is used only with a valid signature; without one its
receiver is the liar. The leading head's own reports are the run's word: it is never the one convicted.
"""
from __future__ import annotations

from collections.abc import Callable

from protocol.boundary_sig import statement
from protocol.spot_check import RECEIVED, Sent
from protocol.wire import KIND_ACTIVATION, KIND_GRADIENT

Verify = Callable[[str, bytes, bytes], bool]  # (peer id, data, signature) -> it signed it
MESSAGE_KIND = {"r": KIND_ACTIVATION, "q": KIND_GRADIENT}  # a receiver's report -> the kind of message signed
WHAT = {"r": "activation", "q": "gradient"}
BY_SIGNATURE = "as its senders' signatures show"  # ends every reason given here (swarm/replicas/replica.py reads it)


class BoundaryEvidence:
    """The reports of one attempt, `(reporter, Sent)` ("" for the leader's own), and the verdicts they carry."""

    def __init__(self, run: str, step: int, attempt: int, leader: str, sent: list[tuple[str, Sent]],
                 verify: Verify) -> None:
        self.run, self.step, self.attempt, self.leader, self.verify = run, step, attempt, leader, verify
        self.sent = [(p or leader, s) for p, s in sent]

    def signed(self, receiver: str, report: Sent) -> bool:
        """Did the sender named in `receiver`'s report sign that message, to `receiver`, with that digest?"""
        data = statement(self.run, self.step, self.attempt, report.microbatch, MESSAGE_KIND[report.kind], receiver,
                         report.digest)
        return self.verify(report.to, data, report.sig)

    def liar(self) -> tuple[str, str] | None:
        """(peer, why) for the first message whose two ends disagree, or None if none does."""
        own = {(p, s.kind, s.microbatch, s.to): s.digest for p, s in self.sent if s.kind not in RECEIVED}
        for receiver, got in self.sent:
            if got.kind not in RECEIVED:
                continue
            said = own.get((got.to, RECEIVED[got.kind], got.microbatch, receiver))
            if said is None or said == got.digest:
                continue
            verdict = self._settle(receiver, got, f"microbatch {got.microbatch}'s {WHAT[got.kind]}")
            if verdict is not None:
                return verdict
        return None

    def _settle(self, receiver: str, got: Sent, what: str) -> tuple[str, str] | None:
        sender = got.to
        # the leader's own reports are the run's word (it checked the signature when it took the message)
        if receiver == self.leader or self.signed(receiver, got):
            if sender == self.leader:  # the leader knows what it signed: not a verdict it takes on itself
                return None
            return sender, (f"it signed {what} to {receiver[-8:]} as other bytes than it reports having sent, "
                            f"{BY_SIGNATURE}")
        return receiver, f"it reports {what} from {sender[-8:]} that {sender[-8:]} never signed, {BY_SIGNATURE}"

    def received(self, receiver: str, report: Sent) -> tuple[str, str] | None:
        """(receiver, why) if `receiver`'s report of a message is not signed by its sender, else None."""
        if receiver == self.leader or self.signed(receiver, report):
            return None
        return receiver, (f"it reports microbatch {report.microbatch}'s {WHAT[report.kind]} from {report.to[-8:]} "
                          f"that {report.to[-8:]} never signed, {BY_SIGNATURE}")

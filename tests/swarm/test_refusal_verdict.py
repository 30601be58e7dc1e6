"""A head's signed refusal of the leading head's reduce (protocol/refusal.py) and the coordinator's verdict on it
(swarm/replicas/refusal_verdict.py, issue 57): the refusal binds the refuser to the very step record it refused,
at its step and attempt; the coordinator bans the refuser for the run (its lease revoked, as a caught liar's) only
on a genuine record (signed by its leader, its data the run's) and the refuser's own signature, never on the
leader's word: a forged, altered or unsigned refusal, or a record that is not genuine, bans nobody."""
from __future__ import annotations

import dataclasses

import pytest

from protocol.control import CommandReply, decode_reply, encode_reply
from protocol.refusal import RefusalReport, statement
from protocol.step_record import StepRecord
from protocol.wire import WireError, refusal_reason
from swarm.replicas.data_check import DataVerdict, step_digest
from swarm.replicas.leases import LeaseKeeper
from swarm.replicas.refusal_verdict import RefusalVerdict
from swarm.trust.boundary_signer import IdentitySigner, verify_peer
from swarm.trust.identity import Identity
from tests.swarm.test_data_check import OTHER_DATA, RUN, RUN_DATA, M, record
from tests.swarm.test_leases import Heads

WHY = "the data of step 5 is not the run's (this head's digest differs)."


def refusal(refuser: Identity, rec: StepRecord, reason: str = WHY, step: int | None = None) -> RefusalReport:
    """`refuser`'s signed refusal of the reduce of `rec`'s step (or of `step`) that carried `rec`, as its reply
    carries it and the leader reports it."""
    body = rec.encode()
    said = statement(RUN, rec.step if step is None else step, rec.attempt, body, reason)
    return RefusalReport(RUN, refuser.peer_id, body, reason, IdentitySigner(refuser).sign(said))


def test_a_refusal_verifies_for_its_refuser_and_record_only_and_travels_in_the_reply():
    leader, refuser, other = Identity.generate(), Identity.generate(), Identity.generate()
    rec = record(leader, RUN_DATA)
    signed = refusal(refuser, rec)
    back = RefusalReport.decode(signed.encode(), RUN)
    assert back == signed and verify_peer(refuser.peer_id, back.statement(rec.step, rec.attempt), back.signature)
    # altered: another reason, step, attempt, record or run under the same signature; or another head's key
    assert not verify_peer(other.peer_id, signed.statement(rec.step, rec.attempt), signed.signature)
    assert not verify_peer(refuser.peer_id, signed.statement(rec.step + 1, rec.attempt), signed.signature)
    assert not verify_peer(refuser.peer_id, signed.statement(rec.step, rec.attempt + 1), signed.signature)
    for altered in (dataclasses.replace(signed, reason="no step record"),
                    dataclasses.replace(signed, record=record(leader, OTHER_DATA).encode()),
                    dataclasses.replace(signed, run="fedcba9876543210"),
                    dataclasses.replace(signed, signature=IdentitySigner(other).sign(
                        statement(RUN, rec.step, rec.attempt, rec.encode(), WHY)))):
        assert not verify_peer(refuser.peer_id, altered.statement(rec.step, rec.attempt), altered.signature)
    # the reason is signed as the reply carries it: cut to 500 characters
    long = "x" * 900
    assert statement(RUN, 4, 1, b"r", long) == statement(RUN, 4, 1, b"r", long[:500])
    for bad in (b"", b"\x93", signed.encode()[:-3], dataclasses.replace(signed, signature=b"").encode()):
        with pytest.raises(WireError):
            RefusalReport.decode(bad, RUN)
    with pytest.raises(WireError):
        RefusalReport.decode(signed.encode(), "fedcba9876543210")
    reply = CommandReply(4, 1, "failed", reason=WHY, refusal=signed.signature)
    assert decode_reply(encode_reply(reply), M).refusal == signed.signature
    assert decode_reply(encode_reply(CommandReply(4, 1, "ok")), M).refusal == b""


async def test_the_coordinator_bans_a_refuser_of_a_genuine_record_and_nobody_on_less():
    dht = Heads()
    leader, refuser, liar, stranger = (Identity.generate() for _ in range(4))
    dht.heads |= {leader.peer_id: "online", refuser.peer_id: "online", liar.peer_id: "online"}
    keeper = LeaseKeeper(dht, RUN)
    await keeper.tick()
    revokes = []

    async def revoke(head: str, why: str, to, caught: int) -> bool:
        revokes.append((head, why, to, caught))
        return await keeper.revoke(head, why, to, caught)

    async def heads() -> list[str]:
        return keeper.lease.order
    data = DataVerdict(RUN, M, lambda: RUN_DATA, revoke, heads=heads)
    verdict = RefusalVerdict(data)
    genuine = record(leader, RUN_DATA)

    async def judged(report: RefusalReport | bytes, sender: str = leader.peer_id) -> str:
        """'' if the refuser is banned, else why not."""
        reply = await verdict.on_report(report if isinstance(report, bytes) else report.encode(), sender)
        return "" if reply == b"" else refusal_reason(reply)
    # a record that is not genuine: other data (the refuser was right), or not signed by the leader it names
    assert "the refusal was right" in await judged(refusal(refuser, record(leader, OTHER_DATA)))
    unsigned = StepRecord(RUN, 4, 1, leader.peer_id, step_digest(RUN_DATA, 4, M))
    assert "not signed by the leader" in await judged(refusal(refuser, unsigned))
    forged_leader = dataclasses.replace(genuine, leader=liar.peer_id)  # the leader's signature, another name
    assert "not signed by the leader" in await judged(refusal(refuser, forged_leader), liar.peer_id)
    # the refusal unsigned, forged (another key), or signed for another step than the record's
    assert "carry the refuser's signature" in await judged(
        dataclasses.replace(refusal(refuser, genuine), signature=b"").encode())
    forged = dataclasses.replace(refusal(liar, genuine), refuser=refuser.peer_id)
    assert "not signed by the head it names" in await judged(forged)
    assert "not signed by the head it names" in await judged(refusal(refuser, genuine, step=genuine.step + 1))
    # genuine, but reported by another than the leader, or of the leader itself, or by no head
    assert "only the leader" in await judged(refusal(refuser, genuine), liar.peer_id)
    assert "only the leader" in await judged(refusal(leader, genuine))
    assert "not a head" in await judged(refusal(stranger, genuine))
    assert revokes == [] and keeper.revoked == [] and verdict.banned == 0
    # a genuine record and its refuser's own signature: banned for the run, once, with no rollback
    assert await judged(refusal(refuser, genuine)) == ""
    assert [(h, to, caught) for h, _, to, caught in revokes] == [(refuser.peer_id, None, 0)]
    assert "step 5" in revokes[0][1] and verdict.banned == 1
    assert keeper.lease.revoked == [refuser.peer_id] and refuser.peer_id not in keeper.lease.order
    assert await judged(refusal(refuser, genuine, reason="another reason")) == "" and len(revokes) == 1


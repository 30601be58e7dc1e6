"""The run's data, checked (swarm/replicas/data_check.py, protocol/step_record.py): a leader's signed
step record binds it to the digest of the tokens it fed; a head whose own copy of the data gives
another digest refuses to sum with it and reports it once; the coordinator revokes the leader's
lease only if its own data agrees with the reporter, and never names it again."""
from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
import torch

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from protocol.control import Command
from protocol.step_record import StepRecord, WorkRecord, data_digest
from protocol.wire import WireError
from swarm.replicas.data_check import DataVerdict, StepRecordCheck, sign_record, signed_by_leader, step_digest
from swarm.replicas.leases import LeaseKeeper
from swarm.trust.identity import Identity
from tests.swarm.test_leases import Heads

RUN, M = "0123456789abcdef", 3



RUN_DATA = BatchSource(load_corpus(None, seq_len=16), 16, 2, 0).microbatch
OTHER_DATA = BatchSource(load_corpus(None, seq_len=16), 16, 2, 1).microbatch  # other windows: other tokens


def record(identity: Identity, batches, step: int = 4, attempt: int = 1) -> StepRecord:
    return sign_record(identity)(StepRecord(RUN, step, attempt, identity.peer_id, step_digest(batches, step, M)))


def test_the_digest_follows_every_token_and_a_record_round_trips_and_verifies():
    a = [torch.arange(10).reshape(2, 5), torch.arange(10, 20).reshape(2, 5)]
    b = [a[0].clone(), a[1].clone()]
    b[1][1, 4] += 1
    assert data_digest(a) == data_digest([x.clone() for x in a]) and data_digest(a) != data_digest(b)
    assert data_digest(a) != data_digest(a[::-1])  # the order of the microbatches counts
    leader = Identity.generate()
    rec = record(leader, RUN_DATA)
    back = StepRecord.decode(rec.encode(), RUN)
    assert back == rec and signed_by_leader(back)
    forged = StepRecord(RUN, rec.step, rec.attempt, rec.leader, b"\0" * 32, rec.signer, rec.signature)
    assert not signed_by_leader(forged)  # another digest under the leader's signature
    other = Identity.generate()
    assert not signed_by_leader(StepRecord(RUN, 4, 1, other.peer_id, rec.data, rec.signer, rec.signature))
    for bad in (b"", b"\x93", rec.encode()[:-3]):
        with pytest.raises(WireError):
            StepRecord.decode(bad, RUN)
    with pytest.raises(WireError):
        StepRecord.decode(rec.encode(), "fedcba9876543210")


async def test_a_head_sums_with_a_leader_on_the_runs_data_and_refuses_and_reports_one_on_other_data_once():
    reports, bad = [], []

    async def report(body: bytes) -> None:
        reports.append(body)
    check = StepRecordCheck(RUN, M, RUN_DATA, report, on_bad=bad.append)
    leader = Identity.generate()
    assert await check(Command(RUN, 4, 1, "reduce", record=record(leader, RUN_DATA).encode())) is None
    liar = record(leader, OTHER_DATA)
    for _ in range(3):
        why = await check(Command(RUN, 4, 1, "reduce", record=liar.encode()))
        assert why is not None and "not the run's" in why
    await asyncio.sleep(0)  # the report goes out in a task of its own
    assert reports == [liar.encode()] and len(bad) == 3  # reported once, refused every time
    assert "no step record" in await check(Command(RUN, 4, 1, "reduce"))
    assert "another step" in await check(Command(RUN, 5, 1, "reduce", record=record(leader, RUN_DATA).encode()))


async def test_the_coordinator_revokes_a_liars_lease_only_on_its_own_evidence_and_never_names_it_again():
    dht = Heads()
    liar, honest = Identity.generate(), Identity.generate()
    dht.heads |= {liar.peer_id: "online", honest.peer_id: "online"}
    told = []

    async def on_revoke(lease) -> None:
        told.append(lease.term)
    keeper = LeaseKeeper(dht, RUN, on_revoke=on_revoke)
    await keeper.tick()
    verdict = DataVerdict(RUN, M, lambda: RUN_DATA, keeper.revoke)
    # a report of an honest record does not hold: nothing changes
    assert await verdict.on_report(record(honest, RUN_DATA).encode(), liar.peer_id) != b""
    assert verdict.unfounded == 1 and keeper.revoked == [] and told == []
    forged = StepRecord(RUN, 4, 1, honest.peer_id, step_digest(OTHER_DATA, 4, M))  # unsigned: anyone can write it
    assert await verdict.on_report(forged.encode(), liar.peer_id) != b"" and keeper.revoked == []
    assert await verdict.on_report(record(liar, OTHER_DATA).encode(), honest.peer_id) == b""
    assert keeper.revoked == [liar.peer_id] and keeper.lease.order == [honest.peer_id] and len(told) == 1
    assert dht.stored[-1].revoked == [liar.peer_id]
    dht.stamps[liar.peer_id] = 5.0  # it announces again: still never named
    assert (await keeper.tick()).order == [honest.peer_id]


async def test_a_head_that_reports_the_runs_data_as_other_loses_its_lease_and_a_non_head_only_its_word():
    """Issue 57, item 6: a head on other data refuses every honest leader; its false report proves it."""
    dht = Heads()
    leader, foreign, stranger = Identity.generate(), Identity.generate(), Identity.generate()
    dht.heads[leader.peer_id] = "online"
    keeper = LeaseKeeper(dht, RUN)
    await keeper.tick()
    dht.heads[foreign.peer_id] = "online"  # it joins later: the honest head leads
    await keeper.tick()
    assert keeper.lease.order == [leader.peer_id, foreign.peer_id]
    revokes = []

    async def revoke(head: str, why: str, to, caught: int) -> bool:
        revokes.append((head, why, to, caught))
        return await keeper.revoke(head, why, to, caught)
    async def heads() -> list[str]:
        return keeper.lease.order
    verdict = DataVerdict(RUN, M, lambda: RUN_DATA, revoke, heads=heads)
    honest = record(leader, RUN_DATA).encode()
    assert await verdict.on_report(honest, stranger.peer_id) != b""  # no head: its word only
    assert revokes == [] and keeper.lease.order == [leader.peer_id, foreign.peer_id]
    assert await verdict.on_report(honest, foreign.peer_id) != b""  # the report still does not hold
    assert [(h, to, caught) for h, _, to, caught in revokes] == [(foreign.peer_id, None, 0)]  # no rollback
    assert "step 5" in revokes[0][1]
    assert keeper.lease.order == [leader.peer_id] and keeper.lease.revoked == [foreign.peer_id]
    assert keeper.lease.rollback_id == 0  # nothing it did was applied: nothing is undone
    assert await verdict.on_report(honest, foreign.peer_id) != b"" and len(revokes) == 1  # once
    assert verdict.unfounded == 3


async def test_the_leader_does_not_re_hash_its_own_record_and_another_head_still_checks_it():
    reports = []

    async def report(body: bytes) -> None:
        reports.append(body)
    leader = Identity.generate()
    calls = []

    def counted(step: int, mb: int):
        calls.append((step, mb))
        return RUN_DATA(step, mb)
    own = StepRecordCheck(RUN, M, counted, report, me=leader.peer_id)
    liar_record = record(leader, OTHER_DATA).encode()
    assert await own(Command(RUN, 4, 1, "reduce", record=liar_record)) is None and calls == []
    other = StepRecordCheck(RUN, M, counted, report, me="another head")
    assert "not the run's" in await other(Command(RUN, 4, 1, "reduce", record=liar_record))
    assert len(calls) == M


async def test_a_standby_heads_digest_computed_ahead_is_the_one_its_check_uses():
    async def report(body: bytes) -> None:
        pass
    leader = Identity.generate()
    calls = []

    def counted(step: int, mb: int):
        calls.append((step, mb))
        return RUN_DATA(step, mb)
    check = StepRecordCheck(RUN, M, counted, report, me="a standby head")
    check.prepare(3)
    check.prepare(4)  # the next step applied before the leader's reduce of step 3 came: 3's is dropped
    honest, liar = record(leader, RUN_DATA).encode(), record(leader, OTHER_DATA, attempt=2).encode()
    assert await check(Command(RUN, 4, 1, "reduce", record=honest)) is None
    assert "not the run's" in await check(Command(RUN, 4, 2, "reduce", record=liar))  # a re-driven attempt
    assert [c for c in calls if c[0] == 4] == [(4, m) for m in range(M)]  # step 4's batches: generated once


async def test_a_revocation_orders_a_rollback_to_the_newest_snapshot_another_head_vouched_for_once(caplog):
    from swarm.replicas.vouched import SnapshotVouch
    from tests.swarm.test_vouched import Stored, sha

    dht, stored = Heads(), Stored()
    liar, honest = Identity.generate(), Identity.generate()
    dht.heads |= {liar.peer_id: "online", honest.peer_id: "online"}
    keeper = LeaseKeeper(dht, RUN)
    await keeper.tick()
    vouch = SnapshotVouch(stored, RUN, n_stages=2)

    def vouched(step: int, leader: Identity, states: int = 0):
        hashes = {0: sha(step), 1: sha(step + 1)}
        return WorkRecord(RUN, step, leader.peer_id, {}, snapshot_step=step, snapshots=hashes,
                          state_step=states, states=hashes if states else {})
    await vouch.on_record(vouched(2, honest, states=2))
    await vouch.on_record(vouched(4, honest, states=4))
    await vouch.on_record(vouched(6, liar, states=6))  # the liar led from step 5 on: its snapshot is not a target
    assert vouch.before(liar.peer_id, 7, keeper.revoked) == 4
    assert vouch.before(liar.peer_id, 3, keeper.revoked) == 2  # never a snapshot after the caught step
    assert vouch.before(honest.peer_id, 1, keeper.revoked) is None

    async def revoke(head: str, why: str, to: int | None, caught: int) -> bool:
        if to is not None:
            await vouch.forget_after(to)
        return await keeper.revoke(head, why, to, caught)
    verdict = DataVerdict(RUN, M, lambda: RUN_DATA, revoke, lambda h, caught: vouch.before(h, caught, keeper.revoked))
    with caplog.at_level(logging.ERROR):
        assert await verdict.on_report(record(liar, OTHER_DATA, step=6).encode(), honest.peer_id) == b""
    lease = dht.stored[-1]  # signed by the swarm key in a real DHT: only it orders a rollback
    assert lease.order == [honest.peer_id] and lease.revoked == [liar.peer_id]
    assert (lease.rollback_id, lease.rollback_to, lease.rollback_caught, lease.rollback_of) == (1, 4, 7, liar.peer_id)
    assert "rolls back to the snapshot of step 4" in caplog.text and "steps 5-7 are driven again" in caplog.text
    # the undone steps' snapshot and state hashes are no longer vouched for: the re-driven ones will be
    assert sorted(stored.records[-1].steps) == [2, 4] and sorted(stored.states[-1].steps) == [2, 4]
    assert await vouch.take(vouched(6, honest))
    # the order stays in later leases (a head that joins still reads it), under the same number: at most once
    dht.heads["late"] = "online"
    later = await keeper.tick()
    assert later.order == [honest.peer_id, "late"] and (later.rollback_id, later.rollback_to) == (1, 4)
    assert await verdict.on_report(record(liar, OTHER_DATA, step=8).encode(), honest.peer_id) == b""
    assert dht.stored[-1].rollback_id == 1  # the same head reported again: no second order


async def test_with_no_snapshot_from_before_the_liar_led_the_coordinator_says_so_and_orders_nothing(caplog):
    dht = Heads()
    liar, honest = Identity.generate(), Identity.generate()
    dht.heads |= {liar.peer_id: "online", honest.peer_id: "online"}
    keeper = LeaseKeeper(dht, RUN)
    await keeper.tick()
    verdict = DataVerdict(RUN, M, lambda: RUN_DATA, keeper.revoke, lambda head, caught: None)
    with caplog.at_level(logging.ERROR):
        assert await verdict.on_report(record(liar, OTHER_DATA, step=6).encode(), honest.peer_id) == b""
    assert dht.stored[-1].revoked == [liar.peer_id] and dht.stored[-1].rollback_id == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("No snapshot from before it led" in m and "up to step 7" in m and "stay applied" in m for m in errors)


async def test_a_reduce_awaiting_its_digest_gets_it_when_the_next_steps_is_asked_for_meanwhile():
    async def report(body: bytes) -> None:
        pass
    leader, go = Identity.generate(), threading.Event()

    def slow(step: int, mb: int):
        go.wait(30)  # step 3's batches take a while
        return RUN_DATA(step, mb)
    check = StepRecordCheck(RUN, M, slow, report, me="a standby head")
    body = record(leader, RUN_DATA, step=3).encode()
    reduce = asyncio.ensure_future(check(Command(RUN, 3, 1, "reduce", record=body)))
    deadline = time.monotonic() + 10
    while 3 not in check._digests:  # poll: the check is under way, awaiting step 3's digest
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    check.prepare(4)  # the step after is asked for meanwhile
    go.set()
    assert await asyncio.wait_for(reduce, 30) is None

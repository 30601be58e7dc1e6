"""Vouched state (issue 21, item 4), the record and check logic: which state hash a stage agreed
on after a step (`peer/checks/state_votes.py`), the work record and apply reply that carry them, and a
joiner's check of a download against the vouched hashes (`peer/checks/vouched_state.py`)."""
from __future__ import annotations

import asyncio
import time

import pytest

from peer.checks.state_votes import StateVotes
from peer.checks.vouched_state import VouchedStates
from protocol.control import CommandReply, decode_reply, encode_reply
from protocol.step_record import WorkRecord
from protocol.wire import WireError

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

RUN = "0123456789abcdef"


def sha(i: int) -> str:
    return f"{i:064x}"


class Directory:
    def __init__(self) -> None:
        self.failed: list[tuple[str, bool]] = []

    def report_failure(self, peer: str, bad_data: bool = False) -> None:
        self.failed.append((peer, bad_data))


def votes_of(reports: dict[str, tuple[int, str]], leader: str = "h0") -> tuple[StateVotes, Directory]:
    directory = Directory()
    votes = StateVotes(leader, directory)
    for peer, state in reports.items():
        votes.add(peer, state)
    return votes, directory


def test_a_strict_majority_sets_a_stage_hash_and_the_odd_replica_is_taken_out():
    stages = {"h0": 0, "a": 1, "b": 1, "c": 1}
    votes, directory = votes_of({"h0": (5, sha(1)), "a": (5, sha(2)), "b": (5, sha(2)), "c": (5, sha(3))})
    agreed = []
    votes.on_agreed = lambda steps, hashes: agreed.append((steps, hashes))
    assert votes.conclude(5, stages) == {0: sha(1), 1: sha(2)}
    assert agreed == [(5, {0: sha(1), 1: sha(2)})]
    assert directory.failed == [("c", True)]  # avoided as a peer that sent bad data
    assert votes.conclude(5, stages) == {} and len(agreed) == 1  # a step is concluded once
    votes.add("a", (5, sha(9)))  # a reply that comes after its step was concluded counts for nothing
    assert 5 not in votes.votes


def test_a_tie_is_the_leaders_word_on_stage_0_and_no_word_on_another_stage():
    stages = {"h0": 0, "h1": 0, "a": 1, "b": 1}
    votes, directory = votes_of({"h0": (3, sha(1)), "h1": (3, sha(2)), "a": (3, sha(3)), "b": (3, sha(4))})
    hashes, odd = votes.settle(3, stages)
    assert hashes == {0: sha(1)} and odd == ["h1"]
    assert votes.conclude(3, stages) == {0: sha(1)} and directory.failed == [("h1", True)]


def test_a_leader_outvoted_on_its_own_stage_vouches_for_nothing_there_and_is_not_banned_by_itself():
    stages = {"h0": 0, "h1": 0, "h2": 0, "a": 1}
    votes, directory = votes_of({"h0": (2, sha(1)), "h1": (2, sha(2)), "h2": (2, sha(2)), "a": (2, sha(7))})
    assert votes.conclude(2, stages) == {1: sha(7)}
    assert directory.failed == []


def test_only_the_members_of_the_commit_count_and_old_steps_are_dropped():
    votes, _ = votes_of({"gone": (4, sha(1)), "a": (4, sha(2))})
    assert votes.settle(4, {"a": 1}) == ({1: sha(2)}, [])
    for steps in range(10, 30):
        votes.add("a", (steps, sha(steps)))
    assert len(votes.votes) == votes.keep and max(votes.votes) == 29


def test_the_work_record_signs_the_state_hashes_and_the_apply_reply_carries_one():
    record = WorkRecord(RUN, 7, "leader", {}, state_step=7, states={0: sha(1), 1: sha(2)})
    back = WorkRecord.decode(record.encode(), RUN, 2)
    assert (back.state_step, back.states) == (7, {0: sha(1), 1: sha(2)})
    assert back.signing_bytes() == record.signing_bytes()
    other = WorkRecord(RUN, 7, "leader", {}, state_step=7, states={0: sha(1), 1: sha(3)})
    assert other.signing_bytes() != record.signing_bytes()  # a forged hash breaks the leader's signature
    with pytest.raises(WireError):
        WorkRecord.decode(WorkRecord(RUN, 7, "leader", {}, state_step=8, states={0: sha(1)}).encode(), RUN, 2)
    reply = CommandReply(6, 0, "ok", [], {"a": [0, 1]}, state=(7, sha(5)))
    assert decode_reply(encode_reply(reply), 4).state == (7, sha(5))
    assert decode_reply(encode_reply(CommandReply(6, 0, "ok")), 4).state is None
    bad = encode_reply(CommandReply(6, 0, "ok", state=(7, "not a hash")))
    with pytest.raises(WireError):
        decode_reply(bad, 4)


class Records:
    """The vouched hashes of one stage as a joiner reads them, growing as the swarm steps."""

    def __init__(self, known: dict[int, str]) -> None:
        self.known, self.reads = dict(known), 0

    async def __call__(self) -> dict[int, str]:
        self.reads += 1
        return dict(self.known)


async def test_a_joiner_loads_only_the_vouched_state_of_its_step():
    records = Records({10: sha(10), 11: sha(11)})
    check = VouchedStates(records, wait=5.0, poll=0.01)
    assert await check.check(11, sha(11)) is None
    assert "differs" in await check.check(11, sha(99))
    assert "older" in await check.check(3, sha(3))
    assert "announces step 1011" in await check.donor_problem(1011)
    assert await check.donor_problem(13) is None  # the records lag a step or two behind the swarm

    async def vouch_later() -> None:
        await asyncio.sleep(0.2)  # the record of step 12 comes through the coordinator a moment later
        records.known[12] = sha(12)
    later = asyncio.create_task(vouch_later())
    assert await check.check(12, sha(12)) is None and records.reads > 2
    await later


async def test_a_step_the_records_never_vouch_for_is_refused_after_the_wait_and_none_at_all_is_taken_unchecked():
    t0 = time.monotonic()
    assert "no record vouches" in await VouchedStates(Records({10: sha(10)}), wait=0.3, poll=0.01).check(12, sha(12))
    assert time.monotonic() - t0 >= 0.3
    assert await VouchedStates(Records({}), wait=5.0).check(12, sha(12)) is None
    assert await VouchedStates(Records({}), wait=5.0).donor_problem(10**6) is None


async def test_a_step_the_records_went_past_without_vouching_for_it_is_refused_at_once():
    # a donor the swarm left behind serves its state at a step that is not hashed (6); the coordinator vouches
    # only for steps newer than every one it vouched for, so with records at 4 and 8 none for 6 is coming
    t0 = time.monotonic()
    records = Records({4: sha(4), 8: sha(8)})
    problem = await VouchedStates(records, wait=60.0, poll=0.01).check(6, sha(6))
    assert "none will" in problem and time.monotonic() - t0 < 5.0 and records.reads == 1


async def test_a_step_between_two_hashed_ones_is_refused_at_once_even_before_the_records_reach_it():
    # a donor whose stage stopped stepping (a paused swarm) serves its state as it is, at step 6; its replicas hash
    # every 4 steps, so no record of step 6 will come, however long the joiner waits
    t0 = time.monotonic()
    records = Records({4: sha(4)})
    problem = await VouchedStates(records, wait=60.0, poll=0.01, every=4).check(6, sha(6))
    assert "every 4 steps" in problem and time.monotonic() - t0 < 5.0 and records.reads == 1
    assert await VouchedStates(Records({4: sha(4), 8: sha(8)}), wait=0.1, every=4).check(8, sha(8)) is None

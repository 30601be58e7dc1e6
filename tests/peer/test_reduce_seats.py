"""Seats in a step's reduce go to work first (peer/step/seats.py, issue 57 item 5): members that do no work cost a
stage only the probation seats, however many announce it, and more members than a reduce command may name no
longer stop the swarm. The rule on its own, then an in-memory swarm with 6 idle members on a stage of 3 workers."""
from __future__ import annotations

import pytest

from peer.daemon.step_log import AttemptFailed
from peer.step.seats import ReduceSeats
from protocol.control import CommandReply
from protocol.wire import KIND_REDUCE
from tests.peer.swarm_in_memory import TEST_DRIVER_OPTIONS, make_swarm, routers_skip, run_and_stop
from tests.peer.test_replicas import assert_close, spec_for

IDLE = {f"s1r{i}" for i in range(3, 9)}  # 6 members of stage 1 that routers never give a microbatch
STEPS = 6


def status(attempt: int, microbatches: list[int] = (), outcome: str = "ok") -> CommandReply:
    return CommandReply(0, attempt, outcome, list(microbatches))


def test_holders_and_the_proven_are_seated_and_idle_members_only_up_to_the_probation_seats():
    seats = ReduceSeats("lead", max_group=64, probation=2)
    members = ["a", "b", "c"] + [f"x{i:02d}" for i in range(100)]  # 100 idle ids: more than a command may name
    assert seats.needs_status(1, members, [])  # no memory yet, but over max_group: ask who holds work
    replies = {"a": status(0, [0, 1]), "b": status(0, [2]), "c": status(0)} | {p: status(0) for p in members[3:]}
    seated, left_out = seats.choose(1, members, replies, 0, [], b"record")
    assert {"a", "b"} <= set(seated) and len(seated) == 64 and len(left_out) == len(members) - 64
    seats.remember(1, {1: ["a", "b", "c"]})  # a committed step's workers are proven from now on
    replies["c"] = status(0, [3])
    seated, left_out = seats.choose(1, members, replies, 0, [], b"record")
    assert set(seated) >= {"a", "b", "c"} and len(seated) == 3 + 2, seated  # plus the 2 probation seats
    other, _ = seats.choose(1, members, replies, 1, [], b"record")
    assert set(other) - {"a", "b", "c"} != set(seated) - {"a", "b", "c"}  # drawn anew at every attempt
    # a member whose work is in the attempt is seated whatever it is; an unreachable or behind one never
    replies["x50"] = status(0, [5])
    replies["x51"] = status(0, outcome="behind")
    seated, left_out = seats.choose(1, members, replies, 0, [], b"record")
    assert "x50" in seated and "x51" not in seated + left_out


def test_a_small_stage_is_seated_whole_without_a_status_query_and_stage_0_keeps_the_lease_heads():
    seats = ReduceSeats("lead", max_group=64, probation=4)
    seats.remember(1, {0: ["lead"], 1: ["a", "b"]})
    assert not seats.needs_status(1, ["a", "b", "i1", "i2", "i3", "i4"], [])  # 2 proven + 4 probation: all fit
    assert seats.needs_status(1, ["a", "b", "i1", "i2", "i3", "i4", "i5"], [])
    heads = ["lead", "h1", "h2"] + [f"f{i}" for i in range(10)]  # f*: ids that only announce stage 0
    replies = {p: status(0) for p in heads if p != "lead"}
    seated, _ = seats.choose(0, heads, replies, 0, ["lead", "h1", "h2"], b"r")
    assert {"lead", "h1", "h2"} <= set(seated) and len(seated) == 3 + 4


async def test_without_a_step_record_the_probation_seats_are_still_drawn_anew_every_step():
    """A swarm without a coordinator signs no step record: the step itself keeps the draw moving."""
    seats = ReduceSeats("lead", probation=2)
    seats.remember(1, {1: ["a"]})
    members = {"lead": 0, "a": 1} | {f"x{i:02d}": 1 for i in range(30)}

    async def status(peer: str, step: int, attempt: int) -> CommandReply:
        return CommandReply(step, attempt, "ok", [0] if peer == "a" else [])
    drawn = [set((await seats.seat(members, step, 0, status, [], b"")).groups[1]) - {"a"} for step in range(1, 6)]
    assert all(len(d) == 2 for d in drawn) and len(set(map(frozenset, drawn))) > 1, drawn


def test_more_holders_than_a_reduce_seats_fail_the_attempt():
    seats = ReduceSeats("lead", max_group=4)
    members = ["a", "b", "c", "d", "e"]
    with pytest.raises(AttemptFailed, match="5 replicas of stage 1 hold the attempt's work"):
        seats.choose(1, members, {p: status(0, [i]) for i, p in enumerate(members)}, 0, [], b"")


@pytest.fixture
def routers_skip_idle(monkeypatch):
    routers_skip(monkeypatch, IDLE)


async def test_idle_members_beyond_the_probation_seats_are_left_out_told_and_the_run_equals_the_oracle(
        routers_skip_idle, oracle_runs):
    spec = spec_for("subspace", "fp64")
    swarm = await make_swarm(spec, [1, 9], driver_options=dict(TEST_DRIVER_OPTIONS, probation_seats=2))
    driver = swarm.peers["s0r0"].driver
    send, groups = driver._send, []

    async def recording(peer, cmd, timeout=None):
        if cmd.op == "reduce" and peer == "s1r0":
            groups.append((cmd.step, list(cmd.candidates)))
        return await send(peer, cmd, timeout)
    driver._send = recording
    told: dict[str, list[int]] = {p: [] for p in IDLE}
    for p in IDLE:
        swarm.peers[p].commit.on_behind = told[p].append
    logs = await run_and_stop(swarm, STEPS)
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)
    assert all(swarm.peers[p].daemon.tokens_done == 0 for p in IDLE), "an idle member got work: the test shows nothing"
    assert groups[0][0] == 0 and len(groups[0][1]) == 9  # the first commit: no memory of work yet, every member
    later = [g for step, g in groups if step > 0]
    assert later and all(len(g) == 3 + 2 and {"s1r0", "s1r1", "s1r2"} <= set(g) for g in later), groups
    left_out = {p for p, steps in told.items() if steps}
    assert left_out and left_out <= IDLE, told  # told the apply of a step they hold no sum of
    assert all(steps == sorted(steps) and all(s >= 2 for s in steps) for steps in told.values()), told
    assert swarm.net.bytes_sent.get(KIND_REDUCE, 0) > 0

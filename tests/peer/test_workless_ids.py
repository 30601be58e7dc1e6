"""Ids that announce a stage and answer commands but do no work (issue 57: "members, not work") take no seat in
the reduce and have no say on the state (peer/step/reduce_group.py, peer/checks/state_votes.py): steps commit
with 70 of them beside a stage of 3 honest replicas (more than `MAX_GROUP` members: a reduce naming every member
would be refused by every replica), their made-up state hashes take no honest replica out, and an honest
newcomer still joins the reduce once it does work.

The routers here skip the workless ids, as a real router does after its first probe of one (issue 20: a bare
id never returns work); what is tested is who reduces and who is counted."""
from __future__ import annotations

import asyncio

import pytest

from peer.daemon.interfaces import PeerStatus
from peer.daemon.loopback import LoopbackDirectory
from protocol.control import CommandReply, decode_command, encode_reply
from protocol.wire import KIND_CONTROL
from tests.peer.swarm_in_memory import make_swarm, param_hash
from tests.peer.test_replicas import assert_close, spec_for

FAKE = "zz-workless-"  # the workless ids' names (after every honest one's)
MADE_UP = "f" * 64  # the state hash they report
DEADLINE_S = 600.0  # a drive that never commits (a reduce command refused everywhere) fails here, not forever


@pytest.fixture
def routers_skip_workless(monkeypatch):
    pick = LoopbackDirectory.pick

    async def skipping(self, stage: int, exclude=frozenset()) -> str:
        return await pick(self, stage, set(exclude) | {p for p in self.net.status if p.startswith(FAKE)})
    monkeypatch.setattr(LoopbackDirectory, "pick", skipping)


def field_workless(swarm, stage: int, n: int) -> dict[str, list[str]]:
    """`n` ids announced online at `stage` that answer every command "ok" (an apply with a made-up state hash) and
    serve nothing else; returns id -> the ops it was sent."""
    heard: dict[str, list[str]] = {}
    for i in range(n):
        name = f"{FAKE}{i:03d}"
        heard[name] = []

        async def answer(body: bytes, sender: str, ops=heard[name]) -> bytes:
            cmd = decode_command(body, swarm.spec.run_hash)
            ops.append(cmd.op)
            state = (swarm.logs[-1].step if swarm.logs else 1, MADE_UP) if cmd.op == "apply" else None
            return encode_reply(CommandReply(cmd.step, cmd.attempt, "ok", state=state))
        swarm.net.handlers[(name, KIND_CONTROL)] = answer
        swarm.net.status[name] = PeerStatus(stage, "online")
    return heard


async def drive(swarm, steps: int) -> list:
    return await asyncio.wait_for(swarm.drive(steps), DEADLINE_S)


async def test_seventy_workless_ids_beside_three_replicas_take_no_seat_and_the_run_equals_the_oracle(
        routers_skip_workless, oracle_runs):
    spec = spec_for("subspace", "fp64")
    swarm = await make_swarm(spec, [1, 3])
    heard = field_workless(swarm, 1, 70)
    try:
        logs = await drive(swarm, 4)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert [log.step for log in logs] == [1, 2, 3, 4]
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, 4), 1e-10)
    assert len({param_hash(p.runner) for p in swarm.stage(1)}) == 1
    assert all(p.daemon.tokens_done > 0 for p in swarm.stage(1))
    # no workless id was told to reduce or apply: the groups held the 3 replicas that worked
    assert not any(op in ("reduce", "apply") for ops in heard.values() for op in ops)
    assert sorted(swarm.peers["s0r0"].commit.workers) == ["s0r0", "s1r0", "s1r1", "s1r2"]


async def test_four_workless_ids_reporting_one_made_up_state_hash_take_no_honest_replica_out(routers_skip_workless):
    spec = spec_for("subspace", "fp64")
    swarm = await make_swarm(spec, [1, 3])
    fakes = list(field_workless(swarm, 1, 4))
    driver = swarm.peers["s0r0"].driver
    add, reported, agreed = driver.votes.add, [], []

    def with_made_up(peer: str, state: tuple[int, str]) -> None:  # their apply replies reach the tally
        add(peer, state)
        for fake in fakes:
            add(fake, (state[0], MADE_UP))
    driver.votes.add = driver._commands.on_apply = with_made_up
    driver.votes.on_agreed = lambda steps, hashes: agreed.append((steps, hashes))
    driver.directory.report_failure = lambda peer, bad_data=False: reported.append((peer, bad_data))
    try:
        await drive(swarm, 6)  # the state after 4 steps is hashed, and tallied at step 5's commit
    finally:
        await swarm.stop()
    assert agreed and all(MADE_UP not in hashes.values() for _, hashes in agreed)
    assert 1 in agreed[0][1]  # stage 1's replicas agreed on their own hash
    assert not [p for p, bad in reported if bad and not p.startswith(FAKE)], reported


async def test_an_honest_newcomer_joins_the_reduce_once_it_works_beside_seventy_workless_ids(routers_skip_workless):
    spec = spec_for("subspace", "fp64")
    swarm = await make_swarm(spec, [1, 3])
    field_workless(swarm, 1, 70)
    try:
        drove = asyncio.ensure_future(drive(swarm, 8))
        newcomer, at = await swarm.join_after(2, 1, "s1r3", donor="s1r0")
        logs = await drove
        await swarm.applied()
    finally:
        await swarm.stop()
    assert [log.step for log in logs] == list(range(1, 9)) and at < 8
    assert newcomer.daemon.tokens_done > 0, "the newcomer never got a microbatch"
    assert "s1r3" in swarm.peers["s0r0"].driver.groups.worked  # it reduced a contribution that held work
    assert len({param_hash(p.runner) for p in swarm.stage(1)}) == 1  # and it stays level with the others

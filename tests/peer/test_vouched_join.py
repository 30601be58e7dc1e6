"""Vouched state in a whole swarm, in memory (fp64): the leading head tallies every replica's
state hash from its apply replies, a joiner refuses a donor that serves noisy weights (under
their own sha256) and takes the state of an honest one, whose hash is the swarm's after the next
step; a replica whose state went astray is found odd and taken out at once."""
from __future__ import annotations

import asyncio
import time

import pytest
import torch

from peer.checks.vouched_state import VouchedStates
from peer.daemon.loopback import LoopbackDirectory, LoopbackLink
from peer.runner.state_hash import state_bytes, state_sha256
from peer.state import state_transfer
from peer.state.state_transfer import StateError, download_state
from protocol.wire import KIND_STATE
from tests.doubles.hostile_donor import serve_bad_state
from tests.peer.swarm_in_memory import make_swarm, patient_options
from tests.peer.test_replicas import assert_close, spec_for

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

STEPS = 11  # odd: the last step is a hashed one (every 2nd here)


async def test_a_joiner_refuses_a_noisy_donor_and_its_state_is_the_swarms_after_the_next_step(oracle_runs):
    spec = spec_for("subspace", "fp64")
    swarm = await make_swarm(spec, [1, 2])
    agreed: dict[int, dict[int, str]] = {}
    head = swarm.peers["s0r0"]
    for peer in swarm.peers.values():  # hashed every 2nd step; a donor serves a state at such a step
        peer.commit.hasher.every, peer.state.hashed_only = 2, True
    head.driver.votes.on_agreed = lambda steps, hashes: agreed.setdefault(steps, hashes)
    reported: dict[tuple[str, int], str] = {}  # (peer, steps) -> the state hash in its apply reply

    def heard(peer: str, state: tuple[int, str]) -> None:
        reported[(peer, state[0])] = state[1]
        head.driver.votes.add(peer, state)
    head.driver._commands.on_apply = heard
    serve_bad_state(swarm.peers["s1r1"], "near")  # trains honestly, serves noise, boasts 1e9 tokens/s

    async def stage1_records() -> dict[int, str]:
        return {t: h[1] for t, h in agreed.items() if 1 in h}

    async def join() -> tuple[object, str, int]:
        while len(swarm.logs) < 3:
            await asyncio.sleep(0.01)  # poll the run's progress
        newcomer = await swarm.add(1, "s1new", announce="syncing")
        newcomer.commit.hasher.every = 2
        newcomer.vouched = VouchedStates(stage1_records, wait=60.0, poll=0.05)
        announced = {p: swarm.peers[p].status().step for p in ("s1r1", "s1r0")}
        donor = await newcomer.join(["s1r1", "s1r0"], announced=announced)  # the liar first, as it boasts
        await newcomer.announce("online")
        return newcomer, donor, len(swarm.logs)
    try:
        task = asyncio.create_task(join())
        logs = await swarm.drive(STEPS)
        newcomer, donor, joined_at = await task
        await swarm.applied()
    finally:
        await swarm.stop()
    assert donor == "s1r0" and joined_at < STEPS - 1, f"joined after {joined_at} of {STEPS} steps"
    # at every hashed step it applied in a reduce after joining, its state hash is the one the swarm agreed on
    # (and its donor's); a loaded machine only moves the step it joins at, so the run has room for a slow join
    after = sorted(t for (p, t) in reported if p == "s1new" and t in agreed)
    assert after and after[-1] == STEPS - 1, (after, joined_at)
    assert all(reported[("s1new", t)] == agreed[t][1] == reported[("s1r0", t)] for t in after)
    assert newcomer.commit.hasher.last == (STEPS - 1, reported[("s1r0", STEPS - 1)])
    assert all(set(h) == {0, 1} for h in agreed.values()) and sorted(agreed) == list(range(2, STEPS, 2))
    assert state_sha256(newcomer.runner.state_dict()) == state_sha256(swarm.peers["s1r0"].runner.state_dict())
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)


@pytest.fixture
def routers_deal_in_turn(monkeypatch):
    """Each router gives a stage's microbatches to its replicas in turn (the stock pick takes the least
    busy, and on a loaded machine one replica can finish every microbatch before the next is sent, so
    another does none). Only a step's workers have a say on the state after it (peer/checks/state_votes.py):
    4 microbatches dealt in turn to 3 replicas give each one work, and so a say, in every step."""
    turns: dict[tuple[int, int], int] = {}
    pick = LoopbackDirectory.pick

    async def in_turn(self, stage: int, exclude=frozenset()) -> str:
        live = sorted(p.peer_id for p in await self.members(stage) if p.peer_id not in exclude)
        if not live:
            return await pick(self, stage, exclude)  # its own error
        turn = turns.get((id(self), stage), 0)
        turns[(id(self), stage)] = turn + 1
        return live[turn % len(live)]
    monkeypatch.setattr(LoopbackDirectory, "pick", in_turn)


async def test_a_replica_whose_state_goes_astray_is_found_odd_and_taken_out(routers_deal_in_turn):
    spec = spec_for("subspace", "fp64")
    # patient: on a loaded machine a slow honest replica missing a microbatch deadline would be taken out too
    swarm = await make_swarm(spec, [1, 3], **patient_options())
    head = swarm.peers["s0r0"]
    taken_out: list[tuple[str, bool, int]] = []  # (peer, as a bad-data peer, steps logged then)
    head.directory.report_failure = lambda peer, bad_data=False: taken_out.append((peer, bad_data, len(swarm.logs)))
    agreed: dict[int, dict[int, str]] = {}
    head.driver.votes.on_agreed = lambda steps, hashes: agreed.setdefault(steps, hashes)
    astray = swarm.peers["s1r2"]
    for peer in swarm.peers.values():
        peer.commit.hasher.every = 1

    def flip() -> None:  # a bit flip in one weight of one replica
        p = next(astray.runner.module.parameters())
        with torch.no_grad():
            p.view(-1)[0] += 1e-3

    def on_step(log) -> None:
        if log.step == 2:
            asyncio.get_running_loop().create_task(astray.daemon.run(flip))
    try:
        await swarm.drive(4, on_step)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert taken_out and {p for p, _, _ in taken_out} == {"s1r2"} and all(bad for _, bad, _ in taken_out)
    assert min(at for _, _, at in taken_out) >= 2  # not before its state went astray
    assert sorted(agreed) == [1, 2, 3] and all(set(h) == {0, 1} for h in agreed.values())  # 2 of 3 agree


class SlowStateLink(LoopbackLink):
    """A joiner's link whose first state chunk arrives only once the swarm has done another step
    (however slow a loaded machine makes steps), so the donor must forward it that step's sum."""
    swarm = None

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        reply = await super().request(peer, kind, body, timeout)
        if kind == KIND_STATE and len(reply) > 1024 and not getattr(self, "_held", False):
            self._held, done, deadline = True, len(self.swarm.logs), time.monotonic() + 120
            while len(self.swarm.logs) <= done and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # poll the run's progress
        return reply


async def test_a_joiner_that_catches_up_from_a_lone_donor_has_its_donors_state_statistic_and_bytes_included():
    # found by the state hashes: a lone replica forwarded its step's statistic after the step had
    # zeroed it (on the CPU the forwarded tensor was the accumulator itself), so a joiner's re-fit
    # statistic drifted from its donor's while every weight agreed
    spec = spec_for("subspace", "fp64")
    swarm = await make_swarm(spec, [1, 1])
    SlowStateLink.swarm = swarm
    forwarded = []

    async def join() -> object:
        while len(swarm.logs) < 2:
            await asyncio.sleep(0.01)  # poll the run's progress
        newcomer = await swarm.add(1, "s1new", link_cls=SlowStateLink, announce="syncing")
        apply = newcomer.follower._apply
        newcomer.follower._apply = lambda update: (forwarded.append(update.step), apply(update))[1]
        await newcomer.join(["s1r0"])
        await newcomer.announce("online")
        return newcomer
    try:
        task = asyncio.create_task(join())
        await swarm.drive(STEPS)
        newcomer = await task
        await swarm.applied()
    finally:
        await swarm.stop()
    assert forwarded, "the donor forwarded no step: the test tested nothing"
    donor = swarm.peers["s1r0"].runner
    assert newcomer.runner.stat is not None and torch.equal(newcomer.runner.stat, donor.stat)
    assert state_sha256(newcomer.runner.state_dict()) == state_sha256(donor.state_dict())
    # and its serialised state (its snapshots) is byte for byte its donor's, although it was loaded from bytes
    assert state_bytes(newcomer.runner.state_dict()) == state_bytes(donor.state_dict())


async def test_a_paused_donor_serves_a_joiner_only_a_hashed_state_and_an_exporter_its_state_as_it_is(monkeypatch):
    """A hashed-only donor at a step between two hashed ones: a joiner's request ("meta") waits for the next
    hashed step and, when none comes within HASHED_WAIT_S (a swarm that is not training), is refused with a
    reason instead of given a state no record will vouch for; an exporter's ("now") gets the state at once."""
    monkeypatch.setattr(state_transfer, "HASHED_WAIT_S", 1.0)
    swarm = await make_swarm(spec_for("subspace", "fp64"), [1, 1])
    donor = swarm.peers["s1r0"]
    try:
        await swarm.drive(3)
        await swarm.applied()
        donor.commit.hasher.every, donor.state.hashed_only = 2, True  # step 3 is not hashed, and no step follows
        link = LoopbackLink(swarm.net, "joiner")
        t0 = time.monotonic()
        with pytest.raises(StateError, match="reached no step whose state the swarm records within 1 s"):
            await download_state(link, "s1r0", swarm.spec.run_hash, 1 << 30, timeout=20)
        waited = time.monotonic() - t0
        step, state = await asyncio.wait_for(download_state(link, "s1r0", swarm.spec.run_hash, 1 << 30, timeout=20,
                                                            now=True), timeout=20)
    finally:
        await swarm.stop()
    assert waited >= 1.0  # it waited for a hashed step before it said no
    assert step == 3 and state_sha256(state) == state_sha256(donor.runner.state_dict())


async def test_a_joiner_of_a_paused_swarm_gets_the_state_of_the_next_hashed_step_once_it_trains_again():
    """The swarm pauses at an unhashed step: the joiner's request is not answered while it does, and is once
    the swarm steps on to a hashed step, with that step's state (before, a pause of 10 s had the donor serve the
    unhashed state, which the joiner then refused)."""
    swarm = await make_swarm(spec_for("subspace", "fp64"), [1, 1])
    donor = swarm.peers["s1r0"]
    try:
        await swarm.drive(3)
        await swarm.applied()
        donor.commit.hasher.every, donor.state.hashed_only = 2, True
        link = LoopbackLink(swarm.net, "joiner")
        asking = asyncio.create_task(download_state(link, "s1r0", swarm.spec.run_hash, 1 << 30, timeout=60))
        with pytest.raises(TimeoutError):  # paused at step 3: no answer
            await asyncio.wait_for(asyncio.shield(asking), timeout=0.5)
        await swarm.drive(4)  # step 4: hashed
        step, state = await asyncio.wait_for(asking, timeout=30)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert step == 4 and state_sha256(state) == state_sha256(donor.runner.state_dict())

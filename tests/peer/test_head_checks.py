"""Spot checks of heads' shares (issues 21 and 22): every head computes a share of stage 0, so a
stranger's head is checked like any replica. The leader recomputes a drawn head's share from the
tokens it regenerates itself, the activations the head sent (as stage 1 reports them) and the
gradients stage 1 sent back. In memory and in fp64: a head that lies in the reduce, or that sends
stage 1 activations its state does not give, is caught, banned and its work redone, so the run
still equals the one-process oracle to 1e-10; honest heads are never convicted."""
from __future__ import annotations

import asyncio
import time

import pytest

from peer.replica.memory_swarm import TEST_COMMIT_OPTIONS, TEST_DRIVER_OPTIONS
from tests.doubles.misreporter import misreport as lie_about_messages
from tests.peer.swarm_in_memory import make_swarm, param_hash
from tests.peer.test_spot_checks import LIES_FROM, STEPS, make_liar, spec_for

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

LIAR = "s0r1"


def send_other_activations(peer) -> None:
    """`peer` (a head) reduces its honest share but sends stage 1 its forward's output x 1.01."""
    runner, honest_forward = peer.runner, peer.runner.forward

    def forward(step, microbatch, tokens, z_in=None):
        out = honest_forward(step, microbatch, tokens, z_in)
        return out * 1.01 if runner.step >= LIES_FROM else out
    runner.forward = forward


def options(rate: float = 1.0) -> dict:
    return dict(driver_options=dict(TEST_DRIVER_OPTIONS, spot_check_rate=rate),
                commit_options=dict(TEST_COMMIT_OPTIONS, straggle_after=1.0))


async def drive(swarm, liar: str = LIAR) -> list:
    """Every step of the run, driven to the end; the swarm stopped whatever happens. A banned head
    hears of no step after its ban and would stand by for ever: once the run is done, it is taken down."""
    run = asyncio.ensure_future(swarm.drive(STEPS))
    try:
        deadline = time.monotonic() + 300
        while len(swarm.logs) < STEPS and not run.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # poll the run's progress
        if not run.done() and liar in swarm.tasks:
            swarm.net.kill(liar)
            swarm.tasks[liar].cancel()
        logs = await asyncio.wait_for(run, 60)
        await swarm.applied()
    finally:
        if not run.done():
            run.cancel()
        await swarm.stop()
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    return logs


def leader_of(swarm):
    """The head that drove the steps: the one whose spot checks ran."""
    return max(swarm.stage(0), key=lambda p: p.driver.spot.checks)


async def test_honest_heads_are_checked_every_step_and_never_convicted(oracle_runs):
    spec = spec_for(2)
    swarm = await make_swarm(spec, [2, 2], **options())
    logs = await drive(swarm)
    want = oracle_runs.losses(spec, STEPS)
    for step, (log, w) in enumerate(zip(logs, want), start=1):
        assert abs(log.loss - w) <= 1e-10 * abs(w), f"step {step}: {log.loss!r} vs the oracle's {w!r}"
        assert min(log.heads.get(h, 0) for h in ("s0r0", "s0r1")) >= 1, f"step {step}: shares {log.heads}"
    leader = leader_of(swarm)
    assert leader.driver.spot.convicted == []
    assert not any(p.directory.banned for p in swarm.peers.values())
    # the leader recomputed the other head's share at every step (rate 1), from the tokens it regenerated
    assert leader.commit.share_check.checks_run >= STEPS


@pytest.mark.parametrize("mode", ["x-50", "random-honest-norm", "activations"])
async def test_a_lying_head_is_caught_and_the_run_equals_the_oracle(mode, oracle_runs):
    spec = spec_for(2)
    swarm = await make_swarm(spec, [2, 2], **options())
    if mode == "activations":
        send_other_activations(swarm.peers[LIAR])
    else:
        make_liar(swarm.peers[LIAR], mode)
    banned_at = []
    for p in swarm.peers.values():  # when each peer learns of a ban, in steps done
        ban = p.directory.ban
        p.directory.ban = lambda who, why="", ban=ban, name=p.peer_id: (banned_at.append((name, who, len(swarm.logs))),
                                                               ban(who))
    logs = await drive(swarm)
    want = oracle_runs.losses(spec, STEPS)
    for step, (log, w) in enumerate(zip(logs, want), start=1):
        assert abs(log.loss - w) <= 1e-10 * abs(w), f"{mode}: step {step}: {log.loss!r} vs the oracle's {w!r}"
    assert logs[0].heads.get(LIAR, 0) >= 1, "the liar computed no share while it was honest: nothing was tested"
    leader = leader_of(swarm)
    assert leader.peer_id != LIAR
    assert leader.driver.spot.convicted == [LIAR], f"{mode}: convicted {leader.driver.spot.convicted}"
    when = {name: done for name, who, done in banned_at if who == LIAR}
    assert when.get(leader.peer_id, STEPS) <= LIES_FROM + 1, f"{mode}: banned after {when} steps"
    assert not [who for _, who, _ in banned_at if who != LIAR], f"{mode}: an honest peer was banned: {banned_at}"
    # the leader told the liar itself, which stops (swarm/replicas/replica.py); no honest peer heard that of itself
    assert swarm.peers[LIAR].commit.banned.is_set()
    assert not [p for p, peer in swarm.peers.items() if p != LIAR and peer.commit.banned.is_set()]
    assert sum(log.attempts for log in logs) > STEPS, "the liar's step was never re-driven"
    assert all(LIAR not in log.heads for log in logs[LIES_FROM + 1:]), "the banned head still got shares"
    honest = [p for p in swarm.peers if p != LIAR]
    for s in range(spec.n_stages):  # the honest replicas of each stage end bit-identical
        assert len({param_hash(swarm.peers[p].runner) for p in honest if swarm.peers[p].runner.stage == s}) == 1



def misreport(peer, kind: str, about: str | None) -> None:
    """`peer` computes and sends honestly but reports other bytes for the boundary messages of kind `kind`
    ("a" / "g": activations / gradients it sent, "r" / "q": it received) to or from `about` (None: any
    peer). A received message's report keeps its sender's real signature (over other bytes)."""
    lie_about_messages(peer, kind, about, LIES_FROM)


def route_to(peer, receiver: str) -> None:
    """`peer` sends every activation to `receiver` while the receiver serves: the pair a test needs, whatever
    the timing (the loopback directory's least-in-flight pick, ties to the lower id, sends most to s1r0)."""
    directory, pick = peer.directory, peer.directory.pick

    async def picked(stage: int, exclude: set[str] = frozenset()) -> str:
        members = {p.peer_id for p in await directory.members(stage)}
        if receiver in members and receiver not in exclude:
            exclude = set(exclude) | (members - {receiver})
        return await pick(stage, exclude)
    directory.pick = picked


# the liar joined before every honest peer of its stage: join order decides nothing (issue 57)
@pytest.mark.parametrize("liar,kind,about,route", [
    (LIAR, "a", None, ("s0r1", "s1r0")),  # a head that misreports the activations it sent
    ("s1r0", "r", LIAR, ("s0r1", "s1r0")),  # stage 1's first replica misreports what a head sent it
    ("s1r0", "g", LIAR, ("s0r1", "s1r0")),  # ... the gradients it sent a head
    (LIAR, "q", "s1r0", ("s0r1", "s1r0")),  # a head misreports the gradients it got
])
async def test_the_two_ends_of_a_boundary_message_that_disagree_are_settled_by_the_senders_signature(
        liar, kind, about, route, oracle_runs):
    # each message carries its sender's signature, which its receiver reports: a valid one over other bytes
    # than the sender reports convicts the sender, a report without one its receiver (protocol/boundary_sig.py)
    spec = spec_for(2)
    swarm = await make_swarm(spec, [2, 2], **options())
    misreport(swarm.peers[liar], kind, about)
    route_to(swarm.peers[route[0]], route[1])  # the liar must send or receive what it misreports
    logs = await drive(swarm, liar)
    want = oracle_runs.losses(spec, STEPS)
    for step, (log, w) in enumerate(zip(logs, want), start=1):
        assert abs(log.loss - w) <= 1e-10 * abs(w), f"step {step}: {log.loss!r} vs the oracle's {w!r}"
    spot = leader_of(swarm).driver.spot
    assert spot.convicted == [liar]
    # by the evidence: a sender signed other bytes than it reports, a receiver reports bytes never signed
    assert ("other bytes than it reports" if kind in "ag" else "never signed") in spot.reasons[liar], spot.reasons
    assert not [p for p in swarm.peers.values() if set(p.directory.banned) - {liar}], "an honest peer was banned"

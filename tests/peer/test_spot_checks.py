"""Verified contributions (issue 21, items 1-2), in memory and in fp64: a replica that lies in
the reduce, in each way the issue lists, is caught within 2 steps and banned everywhere; its work
is thrown out and redone, so the run still equals the one-process oracle to 1e-10."""
from __future__ import annotations

import asyncio
import math
import time

import pytest
import torch

from peer.checks.robust_sum import suspects as robust_suspects
from peer.daemon.loopback import LoopbackLink
from peer.replica.memory_swarm import TEST_COMMIT_OPTIONS, TEST_DRIVER_OPTIONS
from protocol.spec import preset
from protocol.wire import KIND_GRADIENT
from tests.peer.swarm_in_memory import make_swarm, param_hash

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

STEPS = 3
LIES_FROM = 1  # the liar is honest on step 1 (index 0), then lies on every step


def spec_for(stages: int):
    return preset("tiny", stages=stages, dtype="fp64", wire_dtype="fp64", batch_size=24, microbatch_size=4,
                  basis_updates=False, lr=1e-3)


def make_liar(peer, mode: str) -> None:
    """Turn `peer` into a replica that serves its microbatches honestly but lies in the reduce."""
    runner, commit = peer.runner, peer.commit
    honest_share, last = runner.share, {}

    def share(on_device: bool):
        mbs, flat, stat, overflow = honest_share(on_device)
        if flat is None:
            return mbs, flat, stat, overflow
        previous, last["flat"] = last.get("flat"), flat.clone()
        if runner.step < LIES_FROM:
            return mbs, flat, stat, overflow
        if mode == "x-50":
            flat = flat * -50
        elif mode == "1e30":
            flat = torch.full_like(flat, 1e30)
        elif mode == "random-honest-norm":
            noise = torch.randn_like(flat)
            flat = noise * (flat.norm() / noise.norm())
        elif mode == "nan":
            flat = flat.clone()
            flat[0] = math.nan
        elif mode == "other-microbatches":  # right shape and size: the gradient of other microbatches
            flat = previous
        return mbs, flat, stat, overflow

    runner.share = share
    if mode == "withheld":
        honest_offer = commit.exchange._offer

        async def offer(to: str, body: bytes) -> bool:
            return True if runner.step >= LIES_FROM else await honest_offer(to, body)  # says it sent; never does
        commit.exchange._offer = offer


async def drive(swarm) -> list:
    """Every step of the run, driven to the end; the swarm stopped whatever happens."""
    try:
        logs = await asyncio.wait_for(swarm.drive(STEPS), 300)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    return logs


async def run_with_liar(replicas: list[int], liar_stage: int, liar_index: int, mode: str, oracle_runs):
    spec = spec_for(len(replicas))
    swarm = await make_swarm(spec, replicas, driver_options=dict(TEST_DRIVER_OPTIONS, spot_check_rate=1.0),
                             commit_options=dict(TEST_COMMIT_OPTIONS, straggle_after=1.0))
    liar = f"s{liar_stage}r{liar_index}"
    make_liar(swarm.peers[liar], mode)
    banned_at = []
    for p in swarm.peers.values():  # when each honest peer learns of the ban, in steps done
        ban = p.directory.ban
        p.directory.ban = lambda who, why="", ban=ban, name=p.peer_id: (banned_at.append((name, who, len(swarm.logs))),
                                                               ban(who))
    logs = await drive(swarm)
    want = oracle_runs.losses(spec, STEPS)
    for step, (log, w) in enumerate(zip(logs, want), start=1):
        assert abs(log.loss - w) <= 1e-10 * abs(w), f"{mode}: step {step}: {log.loss!r} vs the oracle's {w!r}"
    honest = [p for p in swarm.peers if p != liar]
    leader = logs and next(p for p in swarm.peers.values() if p.driver is not None and p.driver.spot.convicted)
    assert leader.driver.spot.convicted == [liar], f"{mode}: convicted {leader.driver.spot.convicted}"
    when = {name: done for name, who, done in banned_at if who == liar}
    assert when.get(leader.peer_id, STEPS) <= LIES_FROM + 1, f"{mode}: banned after {when} steps"
    # every honest peer that the leader's aborts reach bans it too, and none bans an honest peer
    assert not [who for _, who, _ in banned_at if who != liar]
    assert set(when) >= {p for p in honest if swarm.peers[p].runner.stage in (liar_stage - 1, liar_stage)}
    for s in range(len(replicas)):  # the honest replicas of each stage end bit-identical
        assert len({param_hash(swarm.peers[p].runner) for p in honest if swarm.peers[p].runner.stage == s}) == 1
    return swarm, logs


@pytest.mark.parametrize("mode", ["x-50", "1e30", "random-honest-norm", "nan", "withheld", "other-microbatches"])
async def test_a_lying_replica_of_three_is_caught_and_the_run_equals_the_oracle(mode, oracle_runs):
    swarm, logs = await run_with_liar([3, 3], 1, 1, mode, oracle_runs)
    assert sum(log.attempts for log in logs) > STEPS, "the liar's step was never re-driven"


async def test_a_lying_middle_stage_is_caught_from_the_gradients_its_neighbours_sent(oracle_runs):
    # a middle stage's inputs are an activation from above and a gradient from below: both checked
    swarm, _ = await run_with_liar([1, 3, 1], 1, 2, "other-microbatches", oracle_runs)
    checkers = [p for p in swarm.peers.values() if p.runner.stage == 1 and p.peer_id != "s1r2"]
    assert sum(p.commit.share_check.checks_run for p in checkers) >= STEPS


# two replicas that disagree: tests/peer/test_two_replica_disputes.py (nobody is banned by join order)


async def test_powersgd_factors_without_microbatches_are_refused_and_their_sender_banned():
    # a replica that serves microbatches but claims none, passing its gradient off as "error feedback"
    spec = spec_for(2).replace(replica_sync="powersgd", replica_sync_rank=2)
    swarm = await make_swarm(spec, [1, 3], commit_options=dict(TEST_COMMIT_OPTIONS, straggle_after=1.0))
    liar = swarm.peers["s1r1"]
    honest_share = liar.runner.share

    def share(on_device: bool):
        mbs, flat, stat, overflow = honest_share(on_device)
        return ([], flat, None, overflow) if liar.runner.step >= LIES_FROM and flat is not None else \
            (mbs, flat, stat, overflow)
    liar.runner.share = share
    logs = await drive(swarm)
    assert all(math.isfinite(log.loss) for log in logs)
    assert swarm.peers["s0r0"].driver.spot.convicted == ["s1r1"]
    assert logs[LIES_FROM].attempts > 1  # refused at the first step it lied, and the step re-driven without it
    assert all("s1r1" in swarm.peers[p].directory.banned for p in ("s0r0", "s1r0", "s1r2"))
    assert param_hash(swarm.peers["s1r0"].runner) == param_hash(swarm.peers["s1r2"].runner)


class AllOutFirst(LoopbackLink):
    """Gradients reach the head only once it has sent every microbatch of the attempt: the head's
    router then spreads them evenly, and every replica of stage 1 works every step (the detector
    needs three working shares)."""
    head = None

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        if kind == KIND_GRADIENT and self.head is not None and peer == self.head.peer_id:
            daemon, deadline = self.head.daemon, time.monotonic() + 60
            while len(daemon.waiting) < daemon.spec.n_microbatches and time.monotonic() < deadline:
                await asyncio.sleep(0.005)  # poll: the head is still sending microbatches
        return await super().request(peer, kind, body, timeout)


async def test_a_share_far_from_the_rest_is_checked_whatever_the_draw_and_honest_shares_never_are(oracle_runs,
                                                                                                monkeypatch):
    # CenteredClip as a detector (peer/checks/robust_sum.py): honest shares are never suspects (the sum applied is the
    # exact one, so the run equals the oracle), and a -50x share is checked at once though draws almost never fire
    import peer.commit.commit
    named = []

    def recorded(shares):
        named.append(robust_suspects(shares))
        return named[-1]
    monkeypatch.setattr(peer.commit.commit, "suspects", recorded)
    spec = spec_for(2)
    honest = await make_swarm(spec, [1, 3], AllOutFirst, driver_options=dict(TEST_DRIVER_OPTIONS,
                                                                              spot_check_rate=1e-9))
    AllOutFirst.head = honest.peers["s0r0"]
    logs = await drive(honest)
    want = oracle_runs.losses(spec, STEPS)
    assert all(abs(log.loss - w) <= 1e-10 * abs(w) for log, w in zip(logs, want))
    assert len(named) >= 3 * STEPS and named == [[]] * len(named), f"honest shares named suspects: {named}"
    assert all(p.daemon.tokens_done for p in honest.stage(1)), "a replica did no work: the detector was not tested"
    assert sum(log.attempts for log in logs) <= STEPS + 1
    named.clear()
    swarm = await make_swarm(spec, [1, 3], AllOutFirst, driver_options=dict(TEST_DRIVER_OPTIONS,
                                                                             spot_check_rate=1e-9))
    AllOutFirst.head = swarm.peers["s0r0"]
    make_liar(swarm.peers["s1r1"], "x-50")
    logs = await drive(swarm)
    assert swarm.peers["s0r0"].driver.spot.convicted == ["s1r1"]
    assert ["s1r1"] in named
    for log, w in zip(logs, want):
        assert abs(log.loss - w) <= 1e-10 * abs(w), (log, w)

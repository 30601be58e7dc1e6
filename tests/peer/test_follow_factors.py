"""A replica catching up on a powersgd stage is forwarded each step as the sums its reduce added up
(exact part, P, Q': peer/commit/follow_forward.py), not as the stage's whole gradient: in the loopback swarm
every step forwarded after the donor knew of the joiner travels in factors, each at most a tenth
of the gradient's bytes, and the joiner ends bit-identical to the replicas it followed, also when
its donor was the stage's only replica (which reduces powersgd's way with itself meanwhile). And
the follower's rebuild is the replicas' own arithmetic: the same bits as `finish`."""
from __future__ import annotations

import asyncio

import pytest
import torch

import peer.replica.stage_peer
from peer.runner.replica_sync import PowerSync
from peer.runner.stage import StageRunner
from protocol.state_wire import encode_follow
from tests.peer.swarm_in_memory import make_swarm, param_hash
from tests.peer.test_replica_sync import _backward, wide_spec

STEPS = 8


async def _join_while_the_swarm_trains(replicas: list[int], donor: str, monkeypatch) -> dict:
    """A newcomer joins stage 1 from `donor` after 2 steps; its download is held until the swarm has
    done 3 more (so that steps are forwarded to it). Returns what the donor forwarded and the end state."""
    spec = wide_spec("powersgd")
    swarm = await make_swarm(spec, replicas)
    forwarded: list[tuple[bool, int]] = []  # (in factors, encoded bytes) per forwarded step
    fwd = swarm.peers[donor].commit.forwarder
    plain = fwd.update

    def seen(reduced, skip):
        update = plain(reduced, skip)
        forwarded.append((update.factors is not None, len(encode_follow(update))))
        return update
    fwd.update = seen
    download = peer.replica.stage_peer.download_state

    async def slow_download(*args, **kwargs):
        got = await download(*args, **kwargs)
        started = len(swarm.logs)
        while len(swarm.logs) < started + 3:
            await asyncio.sleep(0.01)  # poll the run's progress: the swarm goes on while this one downloads
        return got
    monkeypatch.setattr(peer.replica.stage_peer, "download_state", slow_download)
    try:
        task = asyncio.create_task(swarm.join_after(2, 1, "s1new", donor))
        await swarm.drive(STEPS)
        newcomer, joined_at = await task
        await swarm.applied()
    finally:
        await swarm.stop()
    stage1 = swarm.stage(1)
    gradient_bytes = newcomer.runner.layout.numel * 4  # the stage's whole gradient, fp32
    return {"forwarded": forwarded, "gradient_bytes": gradient_bytes, "joined_at": joined_at,
            "synced": newcomer.commit.synced_steps, "hashes": {param_hash(p.runner) for p in stage1},
            "steps": {p.runner.step for p in stage1}}


@pytest.mark.parametrize("replicas,donor", [([1, 2], "s1r0"), ([1, 1], "s1r0")], ids=["two replicas", "lone donor"])
async def test_a_joiner_follows_in_factors_and_ends_identical(replicas, donor, monkeypatch):
    got = await _join_while_the_swarm_trains(replicas, donor, monkeypatch)
    assert got["joined_at"] < STEPS and got["synced"] >= 1, "the newcomer never took part in a reduce"
    assert len(got["steps"]) == 1 and len(got["hashes"]) == 1, "the newcomer differs from the replicas it followed"
    factored = [b for f, b in got["forwarded"] if f]
    # the step being reduced when the snapshot was taken may still go whole; every later one in factors
    assert len(factored) >= 3 and len(got["forwarded"]) - len(factored) <= 1, got["forwarded"]
    assert max(factored) <= got["gradient_bytes"] / 10, (factored, got["gradient_bytes"])


def test_the_followers_rebuild_is_the_replicas_arithmetic_bit_for_bit():
    """A replica's `finish` (three replicas with equal contributions) and a fresh follower's `rebuilt` from
    the same sums give the same flat gradient, bit for bit, whatever the follower's own Q and error."""
    spec = wide_spec("powersgd")
    replica, follower = PowerSync(StageRunner(spec, 0, "cpu")), PowerSync(StageRunner(spec, 0, "cpu"))
    _backward(replica.runner, seed=3)
    _, flat, _ = replica.runner.contribution(on_device=True)
    first = replica.first(flat)
    P_sum = first.P.to(replica.runner.dtype) * 3
    P_hat, Q_mine, Q_flat = replica.second(first, P_sum)
    Q_sum = Q_flat.to(replica.runner.dtype) * 3
    agreed = replica.finish((0, 0), first, first.exact * 3, P_hat, Q_mine, Q_sum)
    follower.state.Q = [torch.randn_like(q) for q in follower.state.Q]  # its own Q takes no part
    assert torch.equal(follower.rebuilt(first.exact * 3, P_sum, Q_sum), agreed)

"""A standby head announces its measured compute speed (peer/step/calibration.py), not 0: measuring
touches nothing of its training, so the swarm still equals the oracle and the standby head's state
stays bit-identical to the leader's."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import torch

from peer.runner.stage import StageRunner
from peer.runner.state_hash import state_sha256
from peer.step.calibration import time_forward_backward
from protocol.spec import preset
from tests.peer.swarm_in_memory import batches, make_swarm

STEPS = 4


def spec_fp64():
    return preset("tiny", stages=2, codec="subspace", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3)


def test_timing_a_microbatch_touches_no_state_grads_or_rng():
    spec = spec_fp64()
    runner, src = StageRunner(spec, 0), batches(spec)
    z = runner.forward(0, 0, src(0, 0))  # mid-step: one microbatch's gradient accumulated, one pending
    runner.backward(0, 0, torch.randn_like(z, generator=torch.Generator().manual_seed(1)))
    runner.forward(0, 1, src(0, 1))
    state, grads = state_sha256(runner.state_dict()), [p.grad.clone() for p in runner.params]
    rng = torch.get_rng_state()
    seconds = time_forward_backward(SimpleNamespace(runner=runner), src(0, 2))
    assert 0 < seconds < 60
    assert state_sha256(runner.state_dict()) == state
    assert all(torch.equal(p.grad, g) for p, g in zip(runner.params, grads)), "a parameter's .grad changed"
    assert torch.equal(torch.get_rng_state(), rng), "the global RNG stream was used"
    assert runner.pending_shape(1) == tuple(z.shape) and runner.step == 0


async def test_standby_head_announces_its_speed_and_trains_as_the_oracle(oracle_runs):
    spec = spec_fp64()
    swarm = await make_swarm(spec, [2, 1])
    for h in swarm.stage(0):  # measure at every step the standby head sees: the most it could ever interleave
        h.driver.calibration.period, h.driver.calibration.budget = 1e-3, 1.0
    try:
        logs = await swarm.drive(STEPS)
        await swarm.applied()
        leader = next(h for h in swarm.stage(0) if h.daemon.leads)
        standby = next(h for h in swarm.stage(0) if not h.daemon.leads)
        cal = standby.driver.calibration
        deadline = time.monotonic() + 10.0
        while cal.measurements < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # poll: the last measurement may still be on the worker
        announced = {p.peer_id: p for p in await swarm.net.directory("s1r0").members(0)}
        # the leader's own compute speed on the same machine, measured the same way
        tokens = batches(spec)(0, 0)
        leader_speed = tokens.shape[0] * spec.seq_len / min(
            [time_forward_backward(leader.daemon, tokens) for _ in range(3)])
        named = list(standby.commit.workers)  # the peers the last apply named: placement's T_0 counts them
        states = {h.peer_id: state_sha256(h.runner.state_dict()) for h in swarm.stage(0)}
    finally:
        await swarm.stop()
    assert cal.measurements >= 2, "the standby head did not measure while it stood by"
    mine = announced[standby.peer_id]
    assert not mine.leads and mine.throughput == cal.speed > 0
    assert standby.peer_id in named, "placement would not count the standby head's speed"
    assert leader_speed / 20 < mine.throughput < 20 * leader_speed, (mine.throughput, leader_speed)
    # the leader's figure is what it was: its last step's tokens / seconds (its next heartbeat announces it)
    assert leader.daemon.throughput == logs[-1].tokens / logs[-1].seconds
    want = oracle_runs.losses(spec, STEPS)
    for step, (log, b) in enumerate(zip(logs, want), start=1):
        assert abs(log.loss - b) <= 1e-10 * abs(b), f"step {step}: swarm {log.loss!r} vs oracle {b!r}"
    assert len(set(states.values())) == 1, "the standby head's state differs from the leader's"

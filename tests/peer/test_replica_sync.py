"""replica_sync "powersgd" in one process over the loopback network: replicas of a stage stay
bit-identical after every step with their constrained weights in span(U), a replica sends
at least 20x fewer bytes per step than with "exact", a replica dying mid-step costs a retry,
and an aborted attempt leaves no trace in the error feedback."""
from __future__ import annotations

import asyncio

import pytest
import torch

from peer.runner.reduced import Reduced
from peer.runner.replica_sync import PowerSync
from peer.runner.stage import StageRunner
from protocol.spec import preset
from protocol.subspace import out_of_subspace
from tests.peer.swarm_in_memory import make_swarm, param_hash, patient_options
from tests.peer.test_replicas import KillOnActivation

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

STEPS = 5


def wide_spec(sync: str, **overrides):
    """tiny with d=256, d_ff=1024: matrices big enough for rank-4 factors to pay off >= 20x. 32 tokens a
    sequence: a gradient's size (what the replicas sum and send) does not depend on it, and a step costs half."""
    fields = dict(stages=2, codec="subspace", d_model=256, d_ff=1024, rank=16, seq_len=32, batch_size=32,
                  microbatch_size=8, lr=1e-3, replica_sync=sync, replica_sync_rank=4, basis_updates=False)
    return preset("tiny", **{**fields, **overrides})


def _drift(runner: StageRunner) -> float:
    return max((out_of_subspace(w, runner.basis.U, rows) for _, w, rows in runner.module.constrained_weights()),
               default=0.0)


async def test_powersgd_replicas_stay_identical_and_in_the_subspace_after_every_step(oracle_runs):
    spec = wide_spec("powersgd")
    swarm = await make_swarm(spec, [2, 2])
    pending = []

    async def measure() -> dict:  # once the driver has told every replica to apply the step
        await swarm.applied()
        return {"equal": [len({param_hash(p.runner) for p in swarm.stage(s)}) == 1 for s in range(2)],
                "drift": max(_drift(p.runner) for p in swarm.peers.values() if not p.runner.is_last),
                "bytes": [p.commit.last_sync_bytes for p in swarm.peers.values()]}

    def check(_log) -> None:
        pending.append(asyncio.ensure_future(measure()))

    try:
        logs = await swarm.drive(STEPS, check)
        checks = await asyncio.gather(*pending)
    finally:
        await swarm.stop()
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    assert all(c["equal"] == [True, True] for c in checks), "replicas of a stage differ after a step"
    assert max(c["drift"] for c in checks) < 1e-6  # fp32: the weights never leave span(U)
    assert all(b > 0 for c in checks for b in c["bytes"])  # every replica really took part in every sync
    # every step's log breaks its commit down: the replies to reduce, the head's own reduce by part, its apply
    own = ["own_record_check", "own_hash_wait", "own_round1", "own_exchange1", "own_round2", "own_exchange2",
           "own_sum", "own_reply"]
    for log in logs:
        parts = log.commit_parts
        assert {"reduce", "checks", "apply", *own} <= set(parts) and all(v >= 0 for v in parts.values()), parts
        assert sum(parts[k] for k in own) <= parts["reduce"] + 1e-3  # its own reduce is inside the wait for all
        assert parts["reduce"] + parts["checks"] + parts["apply"] <= log.commit_seconds + 1e-3
    # it trains: the first step (before any update) is the oracle's, and the loss goes down from there
    (want,) = oracle_runs.losses(spec.replace(replica_sync="exact"), 1)  # the oracle's first step
    assert abs(logs[0].loss - want) <= 1e-5 * want
    assert logs[-1].loss < logs[0].loss - 0.1
    # the error feedback is in use (a replica keeps what was not applied) and differs between replicas
    errors = [p.commit.power.state.error for p in swarm.stage(1)]
    assert all(float(e.abs().max()) > 0 for e in errors[0])
    assert any(not torch.equal(a, b) for a, b in zip(*errors))


async def _bytes_per_step(sync: str) -> dict[str, float]:
    """Reduce bytes per step; a re-driven attempt's reduce would count too, so no deadline here is
    short enough for a loaded machine to miss, and every step must take one attempt."""
    spec = wide_spec(sync)
    swarm = await make_swarm(spec, [2, 2], **patient_options())
    try:
        logs = await swarm.drive(2)
    finally:
        await swarm.stop()
    assert [log.attempts for log in logs] == [1, 1]
    for p in swarm.peers.values():
        assert p.commit.synced_steps == 2
    return {name: p.commit.sync_bytes / p.commit.synced_steps for name, p in swarm.peers.items()}


async def test_powersgd_sends_at_least_20x_fewer_bytes_per_step_than_exact():
    exact, power = await _bytes_per_step("exact"), await _bytes_per_step("powersgd")
    runner = StageRunner(wide_spec("exact"), 1)
    # exact: one contribution of the stage's whole layout (fp32) to the one other replica
    assert exact["s1r0"] > 4 * runner.layout.numel
    # every head computes a share of stage 0 (peer/commit/head_work.py): both heads send a whole contribution
    assert min(exact["s0r0"], exact["s0r1"]) > 4 * StageRunner(wide_spec("exact"), 0).layout.numel
    for name in ("s0r0", "s0r1", "s1r0", "s1r1"):
        assert exact[name] >= 20 * power[name], f"{name}: {exact[name]:.0f} vs {power[name]:.0f} bytes per step"


async def test_a_replica_dying_mid_step_under_powersgd_costs_a_retry_or_a_resend_and_the_rest_stay_identical():
    spec = wide_spec("powersgd")
    link = type("Link", (KillOnActivation,), {"victim": "s1r0", "nth": 5})
    swarm = await make_swarm(spec, [2, 2], link)
    link.swarm = swarm
    try:
        logs = await swarm.drive(STEPS)
    finally:
        await swarm.stop()
    assert "s1r0" in swarm.net.down
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    assert all(log.tokens == spec.batch_size * spec.seq_len for log in logs)
    # the work it held was done again: in a retry, or re-sent at its deadline within the same attempt
    resent = sum(p.daemon.missed_deadlines for p in swarm.peers.values())
    assert max(log.attempts for log in logs) >= 2 or resent >= 1
    assert len({param_hash(p.runner) for p in swarm.stage(0)}) == 1
    assert logs[-1].loss < logs[0].loss


async def test_a_replica_joining_a_powersgd_stage_mid_run_ends_equal_to_the_others():
    """The joiner downloads weights (not the sync state): its Q is the seeded one while the others'
    moved on, and its error starts at zero; the summed factors are still the same on every
    replica, so every replica applies the same step."""
    spec = wide_spec("powersgd")
    swarm = await make_swarm(spec, [1, 2])
    try:
        task = asyncio.create_task(swarm.join_after(2, 1, "s1new", "s1r0"))
        await swarm.drive(STEPS + 1)
        _, joined_at = await task
    finally:
        await swarm.stop()
    stage1 = [swarm.peers[n] for n in ("s1r0", "s1r1", "s1new")]
    assert joined_at < STEPS, "the newcomer joined too late to be tested"
    assert stage1[2].commit.synced_steps >= 1, "the newcomer never took part in a reduce"
    assert len({p.runner.step for p in stage1}) == 1 and len({param_hash(p.runner) for p in stage1}) == 1


def _backward(runner: StageRunner, seed: int) -> None:
    """Every microbatch of the step through forward and backward (a head, with seeded tokens and gradients)."""
    g = torch.Generator().manual_seed(seed)
    spec = runner.spec
    for mb in range(spec.n_microbatches):
        tokens = torch.randint(0, spec.vocab, (spec.microbatch_size, spec.seq_len + 1), generator=g)
        out = runner.forward(runner.step, mb, tokens)
        runner.backward(runner.step, mb, torch.randn(out.shape, generator=g, dtype=out.dtype))


def _one_reduce(sync: PowerSync, key: tuple[int, int]) -> torch.Tensor:
    """A reduce with two other (simulated) replicas whose contributions equal this one's."""
    _, flat, _ = sync.runner.contribution(on_device=True)
    first = sync.first(flat)
    P_hat, Q_mine, Q_flat = sync.second(first, first.P.to(sync.runner.dtype) * 3)
    return sync.finish(key, first, first.exact * 3, P_hat, Q_mine, Q_flat.to(sync.runner.dtype) * 3)


def test_an_attempt_aborted_after_its_reduce_leaves_the_error_feedback_as_it_was():
    spec = wide_spec("powersgd")
    runs = []
    for abort_first in (False, True):
        runner = StageRunner(spec, 0)
        sync = PowerSync(runner)
        _backward(runner, 1)
        if abort_first:
            _one_reduce(sync, (0, 0))  # reduced, never applied: the driver aborts the attempt
            runner.abort_step()
            _backward(runner, 1)  # the step re-driven
        flat = _one_reduce(sync, (0, 2))
        runner.set_reduced(Reduced(0, 2, flat, None, {}))
        runner.apply_reduced(0, 2)
        sync.commit(0, 2)
        _backward(runner, 2)
        runs.append((_one_reduce(sync, (1, 0)), param_hash(runner), [e.clone() for e in sync.state.error]))
    assert torch.equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][2], runs[1][2]))
    assert any(float(e.abs().max()) > 0 for e in runs[0][2])  # there was error feedback to disturb

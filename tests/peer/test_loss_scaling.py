"""fp16's dynamic loss scaling (protocol/loss_scale.py, peer/runner/loss_scaling.py), on the CPU.

fp16 autocast runs on the CPU but takes seconds per matmul-heavy step there, so these tests turn
the scaler on in fp64 and fp32 runs instead (a `LossScale` on every runner: the same code paths
an fp16 run takes) and make overflows happen: injected into one replica's gradients, or real
ones from a scale too large for fp32. Scaling by a power of two changes no bit, so each run is
compared with the one-process reference that skipped the same steps (its step counter, data and
lr schedule move on; its weights and moments do not).
"""
from __future__ import annotations

import asyncio

import pytest
import torch

from peer.daemon.norm_band import NormBand
from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.replica.memory_swarm import batches
from peer.runner.pipeline import InProcessPipeline
from peer.runner.stage import StageRunner
from peer.state.state_transfer import load_state_bytes, state_bytes
from protocol.loss_scale import INITIAL_SCALE, LossScale
from protocol.reference import ReferenceModel
from protocol.spec import preset
from tests.peer.swarm_in_memory import make_swarm, param_hash
from tests.peer.test_replicas import spec_for

SEQ = 32


def small(**kw):
    base = dict(d_model=64, n_heads=4, d_ff=128, seq_len=SEQ, n_layers=2, stages=2, batch_size=8,
                microbatch_size=4, rank=8, dtype="fp64", wire_dtype="fp64", lr=1e-3)
    base.update(kw)
    return preset("tiny", **base)


def scaled(runners, scale: float = INITIAL_SCALE) -> None:
    for r in runners:
        r.loss_scale = LossScale(scale)


def reference_skipping(spec, batch, steps: int, skipped: set[int]) -> tuple[ReferenceModel, list[float]]:
    """The reference run of `steps` steps that skips `skipped` (0-based); the loss of a skipped step
    is its batch's loss under the weights it leaves as they were."""
    ref, losses = ReferenceModel(spec, boundary=True), []
    for step in range(steps):
        if step in skipped:
            with torch.no_grad():
                losses.append(sum(float(ref.loss(batch(step, mb))) for mb in range(spec.n_microbatches))
                              / spec.n_microbatches)
            ref.step += 1  # the data and the lr schedule move on; weights and moments stay
            continue
        losses.append(ref.train_step(batch))
    return ref, losses


def params(modules):
    return [p.detach() for m in modules for p in m.parameters()]


def test_a_power_of_two_loss_scale_changes_no_bit():
    spec = small()
    src = BatchSource(load_corpus(None, seq_len=SEQ), SEQ, spec.microbatch_size, seed=7).microbatch
    pipe = InProcessPipeline(spec)
    scaled(pipe.runners)
    losses = [pipe.train_step(s, src) for s in range(6)]
    ref, want = reference_skipping(spec, src, 6, set())
    assert [r.loss for r in losses] == want  # bit-equal, every step
    assert all(torch.equal(a, b) for a, b in zip(params(r.module for r in pipe.runners), params(ref.stages)))
    assert not any(r.skipped for r in losses)
    assert all(r.scale == INITIAL_SCALE and r.loss_scale.good_steps == 6 for r in pipe.runners)


def test_a_scale_too_large_for_fp32_overflows_halves_and_then_trains_like_the_reference():
    """Real overflows: S = 2^127 makes the scaled loss inf in fp32, so backward gives inf and NaN
    everywhere (the boundary gradient crosses the wire as a flag). The pipeline skips steps until
    S fits, halving it each time, and then trains like the reference that skipped the same steps."""
    spec = small(dtype="fp32", wire_dtype="fp32")
    src = BatchSource(load_corpus(None, seq_len=SEQ), SEQ, spec.microbatch_size, seed=7).microbatch
    pipe = InProcessPipeline(spec)
    scaled(pipe.runners, 2.0 ** 127)
    results = [pipe.train_step(s, src) for s in range(12)]
    skipped = {r.step for r in results if r.skipped}
    assert skipped == set(range(len(skipped))) and 1 <= len(skipped) < 12, skipped  # the first ones, then none
    assert all(r.scale == 2.0 ** (127 - len(skipped)) for r in pipe.runners)
    assert pipe.wire.backward_messages == 12 * spec.n_microbatches  # every overflowed gradient travelled, flagged
    _, want = reference_skipping(spec, src, 12, skipped)
    for step, (got, ref) in enumerate(zip([r.loss for r in results], want)):
        assert abs(got - ref) <= 1e-5 * abs(ref), (step, got, ref)
    assert results[-1].loss < results[len(skipped)].loss - 0.05  # it trained after the scale settled


STEPS, POISONED = 6, 2


def poison(runners, at_step: int, where: str) -> list[int]:
    """Make the first microbatch of `at_step` that any of `runners` (the last stage's replicas)
    computes overflow: an inf in a weight gradient, or a NaN in the boundary gradient it sends back.
    Returns a list that gets the stage's microbatch index once poisoned."""
    done: list[int] = []
    for runner in runners:
        def forward_backward(step, mb, tokens, z, runner=runner, orig=runner.forward_backward):
            loss, g = orig(step, mb, tokens, z)
            if step == at_step and not done:
                done.append(mb)
                if where == "weight":
                    runner.params[0].grad.view(-1)[0] = float("inf")
                else:
                    g = g.clone()
                    g.view(-1)[0] = float("nan")
            return loss, g
        runner.forward_backward = forward_backward
    return done


@pytest.mark.parametrize("where", ["weight", "boundary"])
async def test_an_overflow_on_one_replica_skips_the_step_on_every_replica(where):
    """2 stages x 2 replicas, fp64 with the scaler on: one replica of the last stage overflows in one
    microbatch of step 3 (in a weight gradient: its contribution says so; or in the boundary gradient
    it sends to stage 0: the flag travels, and stage 0 is the one that overflowed). Every replica of
    every stage skips step 3, halves its scale, stays identical to the others, refuses nothing, and
    the run equals the reference that skipped step 3."""
    spec = spec_for("subspace", "fp64")  # tiny narrowed (test_replicas): a skipped step skips at any size
    swarm = await make_swarm(spec, [2, 2])
    runners = [p.runner for p in swarm.peers.values()]
    scaled(runners)
    done = poison([p.runner for p in swarm.stage(1)], POISONED, where)
    hashes_equal, checks = [], []

    async def compare() -> None:
        await swarm.applied()
        hashes_equal.append(all(len({param_hash(p.runner) for p in swarm.stage(s)}) == 1 for s in range(2)))

    try:
        logs = await swarm.drive(STEPS, lambda _log: checks.append(asyncio.ensure_future(compare())))
        await asyncio.gather(*checks)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert done, "no microbatch of the poisoned step reached the last stage"
    assert [log.skipped for log in logs] == [s == POISONED for s in range(STEPS)]
    assert [log.loss_scale for log in logs] == [INITIAL_SCALE] * POISONED + [INITIAL_SCALE / 2] * (STEPS - POISONED)
    for p in swarm.peers.values():
        assert [r.skipped for r in p.commit.records] == [s == POISONED for s in range(STEPS)], p.peer_id
        assert p.runner.scale == INITIAL_SCALE / 2 and p.runner.loss_scale.good_steps == STEPS - POISONED - 1
        assert p.daemon.refused == 0, p.peer_id  # an overflow is no offence: nobody refused (or banned) anyone
    assert hashes_equal == [True] * STEPS, "replicas of a stage differ after a step"
    ref, want = reference_skipping(spec, batches(spec), STEPS, {POISONED})
    for step, (log, ref_loss) in enumerate(zip(logs, want)):
        assert abs(log.loss - ref_loss) <= 1e-10 * abs(ref_loss), (step, log.loss, ref_loss)
    for s in range(2):
        got = params([swarm.stage(s)[0].runner.module])
        for a, b in zip(got, params([ref.stages[s]])):
            assert float((a - b).norm()) <= 1e-9 * float(b.norm()) + 1e-12


def test_the_loss_scale_is_part_of_the_stage_state():
    spec = small()
    runner = StageRunner(spec, 1)
    scaled([runner], 2.0 ** 9)
    runner.loss_scale.good_steps = 17
    other = StageRunner(spec, 1)
    scaled([other])
    other.load_state_dict(load_state_bytes(state_bytes(runner.state_dict())))  # as checkpoints and joiners get it
    assert (other.scale, other.loss_scale.good_steps) == (2.0 ** 9, 17)


def test_the_norm_band_judges_a_scaled_gradient_by_its_true_size():
    band = NormBand(warmup=2)
    g = torch.full((4, 8, 16), 1e-3, dtype=torch.float64)
    for _ in range(3):
        assert band.check(g) is None
    assert band.check(g * 2.0 ** 24, scale=2.0 ** 24) is None  # S = 2^24: the true gradient is as before
    assert band.check(g * 2.0 ** 24) is not None  # unscaled, the same numbers are far out of the band


async def test_a_replica_that_joins_takes_the_scale_and_skips_with_the_others():
    """A stage-1 replica joins a [1, 1] swarm (scaler on, fp64) after step 3 by downloading the stage's
    state: it gets the scale the swarm halved at step 2, and when step 5 overflows it skips with the
    rest (whether it takes part in that reduce or still follows its donor). It ends identical to its
    donor, with the same scale, and the run equals the reference that skipped steps 2 and 5."""
    spec = spec_for("subspace", "fp64")  # tiny narrowed (test_replicas): a skipped step skips at any size
    swarm = await make_swarm(spec, [1, 1])
    scaled(p.runner for p in swarm.peers.values())
    poison([swarm.peers["s1r0"].runner], 1, "weight")

    async def join():
        while len(swarm.logs) < 3:
            await asyncio.sleep(0.01)  # poll the run's progress
        newcomer = await swarm.add(1, "s1new", announce="syncing")
        scaled([newcomer.runner])  # the scaler on, as in an fp16 run; its scale then comes with the state
        poison([swarm.peers["s1r0"].runner, newcomer.runner], 4, "boundary")
        await newcomer.join(["s1r0"])
        await newcomer.announce("online")
        return newcomer, len(swarm.logs)

    try:
        task = asyncio.create_task(join())
        logs = await swarm.drive(STEPS)
        newcomer, joined_at = await task
        await swarm.applied()
    finally:
        await swarm.stop()
    assert joined_at < STEPS - 1, "the newcomer joined too late to be tested"
    assert [log.skipped for log in logs] == [s in (1, 4) for s in range(STEPS)]
    donor = swarm.peers["s1r0"].runner
    assert newcomer.runner.step == donor.step == STEPS
    assert param_hash(newcomer.runner) == param_hash(donor)
    assert newcomer.runner.scale == donor.scale == INITIAL_SCALE / 4
    assert newcomer.runner.loss_scale.good_steps == donor.loss_scale.good_steps == STEPS - 5
    _, want = reference_skipping(spec, batches(spec), STEPS, {1, 4})
    for step, (log, ref_loss) in enumerate(zip(logs, want)):
        assert abs(log.loss - ref_loss) <= 1e-10 * abs(ref_loss), (step, log.loss, ref_loss)

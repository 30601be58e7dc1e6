"""The re-fit statistic's window (`RunSpec.stat_window`, docs/algorithms.md 1.7): receiving stages collect the
statistic, and replicas exchange it, only in the W steps before each re-fit; the EMA then leaves out at most
stats_decay^W of its weight. Outside the window a contribution carries no statistic, and one that does is refused."""
from __future__ import annotations

import asyncio

import pytest
import torch

from peer.runner.pipeline import InProcessPipeline
from protocol.control import Contribution, FlatLimits, decode_contribution, encode_contribution
from protocol.spec import RunSpec, preset
from protocol.state_wire import FollowUpdate, decode_follow, encode_follow
from protocol.wire import WireError
from tests.peer.swarm_in_memory import batches, make_swarm, patient_options

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py


def small(**kw):
    base = dict(d_model=32, n_heads=4, d_ff=64, seq_len=16, n_layers=2, stages=2, batch_size=8,
                microbatch_size=4, rank=4, dtype="fp64", wire_dtype="fp64", lr=1e-3, basis_interval=30,
                basis_switch_delay=2, stats_decay=0.5)
    base.update(kw)
    return preset("tiny", **base)


def test_the_window_is_what_leaves_out_at_most_a_millionth_of_the_ema():
    assert RunSpec().stat_window == 132 and 0.9 ** 132 <= 1e-6 < 0.9 ** 131  # the default decay
    assert small().stat_window == 20  # 0.5^20 < 1e-6 < 0.5^19
    assert small(basis_interval=4).stat_window == 4  # a short interval is collected whole, as before the window
    assert small(stats_decay=0.0).stat_window == 1
    spec = small()  # re-fits after steps 29, 59, ...: the window is steps 10-29, 40-59
    assert [t for t in range(60) if spec.in_stat_window(t)] == [*range(10, 30), *range(40, 60)]


def test_the_windowed_ema_is_the_whole_ema_but_a_millionth(monkeypatch):
    """In the steps outside the window the statistic stays zero; at the re-fit it is within stats_decay^W of the
    EMA over every step (the same run with the window widened to the whole interval), and not equal to it."""
    spec = small()
    g = torch.Generator().manual_seed(5)
    data = [torch.randint(0, 256, (4, 17), generator=g) for _ in range(spec.basis_interval * spec.n_microbatches)]

    def batch(step, mb):
        return data[step * spec.n_microbatches + mb]

    def run() -> tuple[list[float], torch.Tensor]:
        pipe = InProcessPipeline(spec)
        norms = []
        for step in range(spec.basis_interval):
            pipe.train_step(step, batch)
            norms.append(float(pipe.runners[1].stat.norm()))
        assert pipe.runners[1].refit_due()
        return norms, pipe.runners[1].stat.clone()

    norms, windowed = run()
    assert norms[:10] == [0.0] * 10 and all(n > 0 for n in norms[10:])
    monkeypatch.setattr(RunSpec, "stat_window", property(lambda s: s.basis_interval))
    whole_norms, whole = run()
    assert all(n > 0 for n in whole_norms)
    rel = float((windowed - whole).norm() / whole.norm())
    assert 0 < rel < 2 * spec.stats_decay ** 20, rel


def test_a_contribution_carries_the_statistic_exactly_in_the_window():
    lim = FlatLimits("run", 1, 10, torch.float64, (4, 2), 2, stat_steps=(10, 3))  # window: steps 7-9, 17-19, ...
    flat, stat = torch.ones(10, dtype=torch.float64), torch.ones(4, 2, dtype=torch.float64)
    for step, inside in ((0, False), (6, False), (7, True), (9, True), (10, False), (19, True)):
        good = Contribution("run", step, 0, 1, [0], flat, stat if inside else None)
        bad = Contribution("run", step, 0, 1, [0], flat, None if inside else stat)
        assert (decode_contribution(encode_contribution(good), lim).stat is not None) == inside
        with pytest.raises(WireError, match="statistic"):
            decode_contribution(encode_contribution(bad), lim)
        follow = FollowUpdate("run", step, flat, stat if inside else None, True)
        assert (decode_follow(encode_follow(follow), lim).stat is not None) == inside
        with pytest.raises(WireError, match="statistic"):
            decode_follow(encode_follow(FollowUpdate("run", step, flat, None if inside else stat, True)), lim)


async def test_replicas_exchange_the_statistic_only_in_the_window_and_keep_it_identical():
    """2 stages x 2 replicas, exact sync, window = the last 6 of 8 steps: the receiving stage's replicas send
    8 d k bytes less a step outside it, hold a zero statistic there, and in it the same statistic as each other
    and (within rounding: the sum's order differs) as the one-process pipeline."""
    spec = small(n_layers=2, batch_size=16, basis_interval=8, stats_decay=0.1)
    assert spec.stat_window == 6  # steps 0-1 outside, 2-7 in
    swarm = await make_swarm(spec, [2, 2], **patient_options())
    pending = []

    async def measure() -> list[tuple[int, float]]:  # once the driver has told every replica to apply the step
        await swarm.applied()
        return [(p.commit.last_sync_bytes, float(p.runner.stat.norm())) for p in swarm.stage(1)]

    def record(_log) -> None:
        pending.append(asyncio.ensure_future(measure()))

    try:
        logs = await swarm.drive(5, record)
        seen = await asyncio.gather(*pending)
        final = [p.runner.stat.clone() for p in swarm.stage(1)]
    finally:
        await swarm.stop()
    assert [log.step for log in logs] == [1, 2, 3, 4, 5]
    pipe = InProcessPipeline(spec)
    src = batches(spec)
    for step in range(5):
        pipe.train_step(step, src)
    assert torch.equal(final[0], final[1]) and float(final[0].norm()) > 0
    assert torch.allclose(final[0], pipe.runners[1].stat, rtol=1e-10, atol=1e-14)
    stat_bytes = 8 * spec.d_model * spec.rank
    outside = [b for step in seen[:2] for b, _ in step]
    inside = [b for step in seen[2:] for b, _ in step]
    assert max(outside) + stat_bytes <= min(inside), (outside, inside)
    assert all(n == 0.0 for step in seen[:2] for _, n in step) and all(n > 0 for step in seen[2:] for _, n in step)

"""The simulator's overlapped schedule (swarm/bench/simulate/overlap.py, issue 54 item 3): two steps in flight on
one-step-stale weights. Where latency dominates it is faster than the synchronous step and never faster than the
busiest resource; where compute dominates there is little to overlap; the default stays the synchronous step."""
from __future__ import annotations

import pytest

from protocol.spec import preset
from swarm.bench.simulate.hardware import StageWork
from swarm.bench.simulate.overlap import busiest_resource_s
from swarm.bench.simulate.validate import Case, _wire_bytes, simulated

SPEC = preset("tiny", codec="subspace", basis_updates=False)  # 3 stages, 2 microbatches
WORK = StageWork((0.010, 0.010, 0.020), (0.010, 0.010, 0.0), (0.002, 0.002, 0.002))
STEPS = 21  # an even number of intervals: the overlapped schedule commits in pairs


def _step_s(case: Case, schedule: str, work: StageWork = WORK) -> float:
    sim = simulated(SPEC, work, case, STEPS, 16, 0.001, schedule)
    return sim["step_tokens"] / sim["tokens_per_second"]


def test_the_default_schedule_is_the_synchronous_step():
    case = Case("subspace", 1, "20mbit", "50ms")
    assert simulated(SPEC, WORK, case, 6, 16, 0.001) == {**simulated(SPEC, WORK, case, 6, 16, 0.001, "sync"),
                                                         "wall_s": pytest.approx(0, abs=1e9)}


def test_latency_bound_steps_overlap_but_not_past_the_busiest_resource():
    case = Case("subspace", 1, "20mbit", "50ms")
    sync, overlap = _step_s(case, "sync"), _step_s(case, "overlap")
    bound = busiest_resource_s(WORK, _wire_bytes(SPEC), SPEC.n_microbatches, 20e6)
    # sync: at least the 2 (S - 1) = 4 one-way crossings of 50 ms and the commit's round trip
    assert sync > 0.3
    # overlapped: two steps share one chain of crossings, so about half, and no less than the busiest resource
    assert bound["bound_s"] < overlap < 0.65 * sync


def test_compute_bound_steps_gain_little():
    slow = StageWork(tuple(10 * f for f in WORK.forward), tuple(10 * b for b in WORK.backward), WORK.apply)
    case = Case("subspace", 1, "unlimited", "0")
    sync, overlap = _step_s(case, "sync", slow), _step_s(case, "overlap", slow)
    bound = busiest_resource_s(slow, _wire_bytes(SPEC), SPEC.n_microbatches, 1e12)
    assert bound["bound_s"] <= overlap * (1 + 1e-9) and overlap < sync < 2.2 * overlap

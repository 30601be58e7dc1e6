"""`RunSpec.microbatches_in_flight` (issue 22 item 2): a head keeps at most that many of its microbatches
between forward and gradient, starting the next as one comes back, so a step of many microbatches
fits a card; the swarm still equals the one-process run (fp64) and its heads still share the step."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from peer.commit.head_work import start_in_window
from peer.daemon.interfaces import LinkError
from peer.runner.memory_estimate import estimate_stage
from protocol.spec import SpecError, preset
from tests.peer.swarm_in_memory import make_swarm, patient_options
from tests.peer.test_every_head import assert_equals_the_oracle
from tests.peer.test_replicas import spec_for

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

STEPS = 4


def count_in_flight(head) -> dict[str, int]:
    """Wrap `head.daemon.start_microbatch`: the most of its microbatches whose loss was not back yet."""
    d, live, seen = head.daemon, set(), {"peak": 0, "started": 0}
    start = d.start_microbatch

    async def counted(step, mb, tokens):
        fut = await start(step, mb, tokens)
        if not fut.done():
            live.add(fut)
            fut.add_done_callback(live.discard)  # registered before the window's own release: counted first
        seen["peak"], seen["started"] = max(seen["peak"], len(live)), seen["started"] + 1
        return fut
    d.start_microbatch = counted
    return seen


@pytest.mark.parametrize("layout, window", [([1, 1], 2), ([2, 2], 1)])
async def test_a_head_keeps_its_window_and_the_run_equals_the_oracle(layout, window, oracle_runs):
    spec = spec_for("subspace", "fp64")  # 4 microbatches a step
    windowed = spec.replace(microbatches_in_flight=window)
    swarm = await make_swarm(windowed, layout, **patient_options())
    seen = {h.peer_id: count_in_flight(h) for h in swarm.stage(0)}
    try:
        logs = await swarm.drive(STEPS)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert all(log.attempts == 1 for log in logs), [log.attempts for log in logs]
    assert max(s["peak"] for s in seen.values()) == window, seen  # the bound held, and it bound
    assert sum(s["started"] for s in seen.values()) == STEPS * spec.n_microbatches
    if layout[0] == 2:  # both heads still computed a share of every step
        assert all(min(log.heads.values()) >= 1 and len(log.heads) == 2 for log in logs)
    assert_equals_the_oracle(swarm, spec, logs, oracle_runs, STEPS)


def test_the_window_is_hash_neutral_at_0_bounds_the_estimate_and_refuses_a_negative():
    spec = preset("large", dtype="bf16", batch_size=128)  # 32 microbatches of 4
    assert spec.max_in_flight == 32 and "microbatches_in_flight" not in spec.to_dict()
    windowed = spec.replace(microbatches_in_flight=8)
    assert windowed.max_in_flight == 8 and windowed.run_hash != spec.run_hash
    assert spec.replace(microbatches_in_flight=64).max_in_flight == 32  # never more than the step's
    full, bounded = estimate_stage(spec, 0), estimate_stage(windowed, 0)
    assert full.in_flight == 32 and bounded.in_flight == 8
    assert bounded.activations * 4 == full.activations and bounded.weights == full.weights
    assert estimate_stage(windowed, 3).in_flight == 1  # the last stage runs backward right after forward
    with pytest.raises(SpecError, match="microbatches_in_flight"):
        spec.replace(microbatches_in_flight=-1)


async def test_a_share_stops_starting_microbatches_once_its_attempt_is_aborted():
    # a head waiting for a slot must not start the rest of its share under the attempt that replaced it
    loop = asyncio.get_running_loop()
    started, futures = [], []

    async def start_microbatch(step, mb, tokens):
        started.append((step, daemon.attempt, mb))
        futures.append(loop.create_future())
        return futures[-1]
    daemon = SimpleNamespace(spec=spec_for("subspace", "fp64").replace(microbatches_in_flight=1), attempt=3,
                             runner=SimpleNamespace(step=7), start_microbatch=start_microbatch)
    task = asyncio.create_task(start_in_window(daemon, 7, [0, 1, 2], lambda mb: mb))
    while not started:
        await asyncio.sleep(0)  # let the task start its first microbatch (no time passes)
    futures[0].set_result(1.0)  # a gradient back frees the slot: the next one starts
    while len(started) < 2:
        await asyncio.sleep(0)
    daemon.attempt = 4  # the leader's abort arrived (adopt_attempt), and the daemon cancels what waited
    futures[1].cancel()
    with pytest.raises(LinkError, match="superseded"):
        await task
    assert started == [(7, 3, 0), (7, 3, 1)]  # nothing was started under attempt 4

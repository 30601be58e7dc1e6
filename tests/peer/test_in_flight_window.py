"""`RunSpec.microbatches_in_flight` (issue 22 item 2): a head keeps at most that many of its microbatches
between forward and gradient, starting the next as one comes back, so a step of many microbatches
fits a card; the swarm still equals the one-process run (fp64) and its heads still share the step."""
from __future__ import annotations

import pytest
import torch

from peer.memory_estimate import estimate_stage
from protocol.spec import SpecError, preset
from tests.peer.swarm_in_memory import make_swarm, patient_options
from tests.peer.test_every_head import oracle_weights
from tests.peer.test_replicas import assert_close, spec_for

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
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)
    want = oracle_weights(spec, STEPS)
    for s in range(spec.n_stages):
        for peer in swarm.stage(s):
            for got, exp in zip(peer.runner.module.parameters(), want[s]):
                assert torch.allclose(got.detach(), exp, rtol=1e-10, atol=1e-12), f"{peer.peer_id}: weights differ"


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

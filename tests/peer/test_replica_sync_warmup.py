"""`RunSpec.replica_sync_warmup`: a powersgd stage sums its replicas' gradients exactly for its first N
steps (the run then equals the one-process run, fp64), then sends rank-r factors (far fewer bytes, no
longer equal), with replicas bit-identical throughout; the option is refused without powersgd and
is accepted only in a contribution's own phase layout (the exact one during the warm-up)."""
from __future__ import annotations

import asyncio

import pytest
import torch

from peer.runner.replica_sync import flat_limits
from peer.runner.stage import StageRunner
from protocol.control import BadContribution, Contribution, decode_reduce, encode_contribution
from protocol.spec import SpecError
from tests.peer.swarm_in_memory import make_swarm, param_hash, patient_options
from tests.peer.test_replica_sync import wide_spec
from tests.peer.test_replicas import assert_close

WARMUP, STEPS = 2, 4  # the last step's loss is the first one moved by a powersgd sum


async def test_the_warm_up_sums_exactly_then_powersgd_takes_over(oracle_runs):
    spec = wide_spec("powersgd", replica_sync_warmup=WARMUP, dtype="fp64", wire_dtype="fp64")
    exact = spec.replace(replica_sync="exact", replica_sync_warmup=0)
    swarm = await make_swarm(spec, [2, 2], **patient_options())
    pending = []

    async def measure() -> dict:
        await swarm.applied()
        return {"equal": all(len({param_hash(p.runner) for p in swarm.stage(s)}) == 1 for s in range(2)),
                "bytes": min(p.commit.last_sync_bytes for p in swarm.peers.values())}

    try:
        logs = await swarm.drive(STEPS, lambda _log: pending.append(asyncio.ensure_future(measure())))
        checks = await asyncio.gather(*pending)
    finally:
        await swarm.stop()
    assert all(c["equal"] for c in checks), "replicas of a stage differ after a step"
    want = oracle_runs.losses(exact, STEPS)
    # steps 1..WARMUP + 1 are computed from weights that only exact sums moved: the one-process run's
    assert_close([log.loss for log in logs[:WARMUP + 1]], want[:WARMUP + 1], 1e-10)
    assert abs(logs[-1].loss - want[-1]) > 1e-6 * abs(want[-1])  # the factors' approximation is not exact
    warm, compressed = [c["bytes"] for c in checks[:WARMUP]], [c["bytes"] for c in checks[WARMUP:]]
    assert min(warm) > 20 * max(compressed), (warm, compressed)  # a whole gradient, then rank-4 factors


def test_the_warm_up_is_refused_without_powersgd_and_each_phase_layout_holds_only_its_steps():
    with pytest.raises(SpecError, match="replica_sync_warmup"):
        wide_spec("exact", replica_sync_warmup=5)
    with pytest.raises(SpecError, match="replica_sync_warmup must be"):
        wide_spec("powersgd", replica_sync_warmup=-1)
    spec = wide_spec("powersgd", replica_sync_warmup=WARMUP)
    assert [spec.powersgd_at(s) for s in range(WARMUP + 2)] == [False] * WARMUP + [True, True]
    assert "replica_sync_warmup" not in wide_spec("powersgd").to_dict()  # 0 keeps the hash of specs before it
    lim = flat_limits(spec, StageRunner(spec, 0))
    assert lim.exact_until == WARMUP and lim.at(WARMUP - 1).phases == () and lim.at(WARMUP) == lim
    whole = torch.zeros(lim.numel, dtype=lim.dtype)
    for step, ok in ((WARMUP - 1, True), (WARMUP, False)):  # a whole gradient is a contribution in the warm-up only
        body = encode_contribution(Contribution(spec.run_hash, step, 0, 0, [0], whole, None))
        if ok:
            assert decode_reduce(body, lim).grads.numel() == lim.numel
        else:
            with pytest.raises(BadContribution):
                decode_reduce(body, lim)

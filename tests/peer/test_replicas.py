"""Several replicas per stage, in one process over the loopback network: they train like the
single-replica in-process oracle, stay bit-identical, survive a replica (or the leading head)
dying mid-step, and a fresh replica joins mid-run by downloading the stage's state."""
from __future__ import annotations

import asyncio

import pytest

from peer.daemon.loopback import LoopbackLink
from protocol.spec import preset
from protocol.wire import KIND_ACTIVATION
from tests.peer.swarm_in_memory import make_swarm, param_hash

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py

STEPS = 6


# tiny narrowed (d 64, d_ff 128, 32 tokens): a swarm equals the one-process run at any size, and at this one a step
# costs a quarter of tiny's CPU; the layers, stages and microbatches (what the swarm splits and sends) are tiny's
SMALLER = dict(d_model=64, d_ff=128, seq_len=32)


def spec_for(codec: str, dtype: str):
    wire = "fp64" if dtype == "fp64" else "fp32"
    hybrid = dict(codec="subspace", residual_width=4, basis_updates=False) if codec == "hybrid" else dict(codec=codec)
    return preset("tiny", stages=2, dtype=dtype, wire_dtype=wire, batch_size=32, microbatch_size=8, lr=1e-3, **hybrid,
                  **SMALLER)


def assert_close(losses: list[float], want: list[float], rel: float) -> None:
    for step, (a, b) in enumerate(zip(losses, want), start=1):
        assert abs(a - b) <= rel * abs(b), f"step {step}: swarm {a!r} vs oracle {b!r} (rel {abs(a - b) / abs(b):.1e})"


@pytest.mark.parametrize("codec,dtype,rel", [("subspace", "fp64", 1e-10), ("bottleneck", "fp64", 1e-10),
                                             ("dense", "fp64", 1e-10), ("hybrid", "fp64", 1e-10),
                                             ("subspace", "fp32", 1e-5)])
async def test_two_by_two_equals_the_oracle_and_replicas_stay_identical(codec, dtype, rel, oracle_runs):
    spec = spec_for(codec, dtype)
    swarm = await make_swarm(spec, [2, 2])
    hashes_equal, checks = [], []

    async def compare() -> None:  # once the driver has told every replica to apply the step
        await swarm.applied()
        hashes_equal.append(all(len({param_hash(p.runner) for p in swarm.stage(s)}) == 1 for s in range(2)))

    def check(_log) -> None:
        checks.append(asyncio.ensure_future(compare()))

    try:
        logs = await swarm.drive(STEPS, check)
        await asyncio.gather(*checks)
    finally:
        await swarm.stop()
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), rel)
    assert hashes_equal == [True] * STEPS, "replicas of a stage differ after a step"
    # both replicas of stage 1 did real work: the head spread its microbatches over them
    assert all(p.daemon.tokens_done > 0 for p in swarm.stage(1))


class KillOnActivation(LoopbackLink):
    """Kills `victim` when it is sent its `nth` activation (delivered first: it dies mid-step,
    holding work that is then lost)."""
    victim: str = ""
    nth: int = 0
    swarm = None

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        reply = await super().request(peer, kind, body, timeout)
        cls = type(self)
        if kind == KIND_ACTIVATION and peer == cls.victim:
            cls.nth -= 1
            if cls.nth == 0:
                cls.swarm.kill(peer)
        return reply


@pytest.mark.parametrize("victim", ["s1r0", "s0r0"], ids=["a middle replica", "the leading head"])
async def test_a_replica_dying_mid_step_costs_a_retry_not_a_step(victim, oracle_runs):
    spec = spec_for("subspace", "fp64")
    link = type("Link", (KillOnActivation,), {"victim": victim, "nth": 5})
    if victim == "s0r0":  # the head sends activations, it does not receive them: kill it on its 11th send
        link = type("Link", (KillOnSend,), {"victim": victim, "nth": 11})
    swarm = await make_swarm(spec, [2, 2], link)
    link.swarm = swarm
    try:
        logs = await swarm.drive(STEPS)
    finally:
        await swarm.stop()
    assert victim in swarm.net.down, "the victim was never killed"
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    assert all(log.tokens == spec.batch_size * spec.seq_len for log in logs)  # every step had all its tokens
    # the work it held was done again: in a retry, or re-sent at its deadline within the same attempt
    resent = sum(p.daemon.missed_deadlines for p in swarm.peers.values())
    assert max(log.attempts for log in logs) >= 2 or resent >= 1 or victim == "s0r0"
    # no microbatch lost or counted twice
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)


class KillOnSend(LoopbackLink):
    """Kills the sender `victim` right after its `nth` activation was delivered."""
    victim: str = ""
    nth: int = 0
    swarm = None

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        reply = await super().request(peer, kind, body, timeout)
        cls = type(self)
        if kind == KIND_ACTIVATION and self.peer_id == cls.victim:
            cls.nth -= 1
            if cls.nth == 0:
                cls.swarm.kill(self.peer_id)
        return reply


async def test_a_fresh_replica_joins_mid_run_and_equals_its_donor(oracle_runs):
    spec = spec_for("subspace", "fp64")
    swarm = await make_swarm(spec, [1, 1])
    try:
        task = asyncio.create_task(swarm.join_after(3, 1, "s1new", "s1r0"))
        logs = await swarm.drive(STEPS)
        newcomer, joined_at = await task
    finally:
        await swarm.stop()
    assert joined_at < STEPS - 1, "the newcomer joined too late to be tested"
    assert newcomer.runner.step == swarm.peers["s1r0"].runner.step == STEPS
    assert param_hash(newcomer.runner) == param_hash(swarm.peers["s1r0"].runner)
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)


async def test_a_head_that_joins_later_with_a_lower_id_stands_by_and_takes_over_when_the_leader_dies(oracle_runs):
    """A leader keeps the lead (peer/step/leadership.py): the newcomer's lower id does not take it; the
    newcomer drives only after the leader is killed, and no step is lost or applied twice."""
    spec = spec_for("subspace", "fp64")
    steps, kill_after = 6, 4
    swarm = await make_swarm(spec, [0, 1])
    await swarm.add(0, "s0r9")
    by: dict[str, list[int]] = {"s0r9": [], "s0r0": []}
    try:
        swarm.tasks = {"s0r9": asyncio.create_task(swarm.peers["s0r9"].drive(
            steps, lambda log: (swarm.logs.append(log), by["s0r9"].append(log.step))))}
        newcomer, _ = await swarm.join_after(2, 0, "s0r0", "s0r9")
        assert "s0r0" < "s0r9" and newcomer.runner.step < kill_after
        swarm.tasks["s0r0"] = asyncio.create_task(newcomer.drive(
            steps, lambda log: (swarm.logs.append(log), by["s0r0"].append(log.step))))
        while len(swarm.logs) < kill_after:
            await asyncio.sleep(0.01)  # poll the run's progress
        swarm.kill("s0r9")
        await swarm.tasks["s0r0"]
    finally:
        await swarm.stop()
    assert by["s0r9"] == list(range(1, len(by["s0r9"]) + 1)) and len(by["s0r9"]) >= kill_after
    assert by["s0r0"] and by["s0r0"][0] > kill_after - 1 and by["s0r0"][-1] == steps
    # a step the leader applied only on itself before it died is driven again by the new leader:
    # two records of it, on the same weights (the same loss); any other repeat would be a doubled step
    final = {log.step: log for log in swarm.logs}
    assert sorted(final) == list(range(1, steps + 1))
    for log in swarm.logs:
        assert abs(log.loss - final[log.step].loss) <= 1e-10 * abs(log.loss), f"step {log.step} was applied twice"
    assert len(swarm.logs) - steps <= 1, [log.step for log in swarm.logs]
    assert_close([final[s].loss for s in range(1, steps + 1)], oracle_runs.losses(spec, steps), 1e-10)

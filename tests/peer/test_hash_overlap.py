"""The state hash runs off the step's critical path (peer/commit/commit.py): a replica hashes its state
after a hashed step on a thread while the next step's microbatches run through it, and the next
apply waits for the hash. In memory, fp64, with a hash made slow: stage 1 computes microbatches
of the next step while its hash of the last is still running, every hashed step is still agreed
by the leader's tally (each stage's hash equal to its state's), and the run equals the oracle."""
from __future__ import annotations

import time

import peer.runner.state_hasher as hasher_module
from peer.runner.state_hash import state_sha256
from tests.peer.swarm_in_memory import make_swarm
from tests.peer.test_replicas import assert_close, spec_for

STEPS = 5
SLOW_S = 0.3  # what the hash takes here: a stand-in for a GPU stage's gigabytes


async def test_a_replica_computes_the_next_step_while_it_hashes_and_the_votes_still_agree(oracle_runs, monkeypatch):
    spec = spec_for("subspace", "fp64")
    hashing: list[tuple[int, float, float]] = []  # (steps, start, end) of each hash, on the stage-1 peer

    def slow_hash(state: dict) -> str:
        start = time.monotonic()
        time.sleep(SLOW_S)  # the hash's own cost, stretched; nothing waits on a condition here
        sha = state_sha256(state)
        if state["stage"] == 1:
            hashing.append((state["step"], start, time.monotonic()))
        return sha
    monkeypatch.setattr(hasher_module, "state_sha256", slow_hash)
    swarm = await make_swarm(spec, [1, 1])
    for p in swarm.peers.values():
        p.commit.hasher.every = 2
    head, tail = swarm.peers["s0r0"], swarm.peers["s1r0"]
    agreed: dict[int, dict[int, str]] = {}
    head.driver.votes.on_agreed = lambda steps, hashes: agreed.setdefault(steps, hashes)
    computed: list[tuple[int, float]] = []  # (step, when) of each microbatch stage 1 started
    honest = tail.runner.forward_backward

    def forward_backward(step, microbatch, tokens, z_in):
        computed.append((step, time.monotonic()))
        return honest(step, microbatch, tokens, z_in)
    tail.runner.forward_backward = forward_backward
    try:
        logs = await swarm.drive(STEPS)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert [s for s, _, _ in hashing] == [2, 4]
    # the hash after k steps ran while microbatches of step index k (the next step) went through stage 1
    for steps, start, end in hashing:
        assert any(s == steps and start < t < end for s, t in computed), f"no overlap with the hash after {steps}"
    # every hashed step is agreed for both stages (the last one, 4, concluded at step 5's reduce)
    assert sorted(agreed) == [2, 4] and all(set(h) == {0, 1} for h in agreed.values()), agreed
    assert head.commit.hasher.last[0] == tail.commit.hasher.last[0] == 4
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)


async def test_a_hash_that_fails_is_logged_and_the_run_goes_on(oracle_runs, monkeypatch, caplog):
    spec = spec_for("subspace", "fp64")

    def failing_hash(state: dict) -> str:
        raise RuntimeError("no pinned memory")
    monkeypatch.setattr(hasher_module, "state_sha256", failing_hash)
    swarm = await make_swarm(spec, [1, 1])
    for p in swarm.peers.values():
        p.commit.hasher.every = 2
    try:
        with caplog.at_level("ERROR", logger="peer.commit.commit"):
            logs = await swarm.drive(3)
            await swarm.applied()
    finally:
        await swarm.stop()
    failed = [r.getMessage() for r in caplog.records if "hashing the state after step 2 failed" in r.getMessage()]
    assert len(failed) == 2  # each stage's replica said so
    assert all(p.commit.hasher.last is None for p in swarm.peers.values())
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, 3), 1e-10)

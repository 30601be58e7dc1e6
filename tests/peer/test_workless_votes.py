"""Only replicas that did a step's work have a say on the state after it (issue 57; peer/checks/state_votes.py,
peer/step/driver.py): 4 replicas of a stage that the routers never give a microbatch still reduce (empty
contributions) and apply every step, and here report one made-up state hash; counted, they would outvote the 3
replicas that did the work, which the leader would then take out as odd. Counting only the workers, the made-up
hash is never agreed, no working replica is taken out, and the run equals the oracle."""
from __future__ import annotations

import pytest

from tests.peer.swarm_in_memory import make_swarm, routers_skip, run_and_stop
from tests.peer.test_replicas import assert_close, spec_for

IDLE = {"s1r3", "s1r4", "s1r5", "s1r6"}  # more than the 3 working replicas of stage 1
MADE_UP = "f" * 64
STEPS = 6  # the state after 4 steps is hashed, and tallied at step 5's commit


@pytest.fixture
def routers_skip_idle(monkeypatch):
    routers_skip(monkeypatch, IDLE)


async def test_four_idle_replicas_reporting_one_made_up_hash_take_no_working_replica_out(routers_skip_idle,
                                                                                         oracle_runs):
    spec = spec_for("subspace", "fp64")
    swarm = await make_swarm(spec, [1, 7])
    driver = swarm.peers["s0r0"].driver
    add, agreed, reported = driver.votes.add, [], []

    def made_up(peer: str, state: tuple[int, str]) -> None:  # the idle replicas' apply replies, as the leader reads
        add(peer, (state[0], MADE_UP) if peer in IDLE else state)
    driver.votes.add = driver._commands.on_apply = made_up
    driver.votes.on_agreed = lambda steps, hashes: agreed.append((steps, dict(hashes)))
    driver.directory.report_failure = lambda peer, bad_data=False: reported.append((peer, bad_data))
    logs = await run_and_stop(swarm, STEPS)
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)
    idle = [swarm.peers[p] for p in sorted(IDLE)]
    assert all(p.daemon.tokens_done == 0 for p in idle), "an idle replica got work: the test shows nothing"
    assert all(p.runner.step == STEPS for p in idle), "the idle replicas did not reduce and apply every step"
    assert agreed and all(hashes.get(1) not in (None, MADE_UP) for _, hashes in agreed), agreed
    assert not [p for p, bad in reported if bad], f"a replica was taken out as odd: {reported}"

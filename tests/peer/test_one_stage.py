"""A one-stage swarm: pure data parallel (issue 22's "one stage served by 2 heads"). Each head is
the whole model; the leader splits a step's microbatches over the heads, each computes its share
with no boundary to send, and the heads reduce. In memory and in fp64 it equals the one-process
run; the leader spot-checks another head's share from the tokens alone (regenerated, never taken
from the head), so a head that lies in the reduce is banned and its work redone."""
from __future__ import annotations

import logging

import pytest
import torch

from protocol.spec import preset
from tests.peer.swarm_in_memory import make_swarm, param_hash, patient_options
from tests.peer.test_head_checks import LIAR, drive, leader_of, options
from tests.peer.test_replicas import assert_close
from tests.peer.test_spot_checks import LIES_FROM, STEPS, make_liar, spec_for

pytestmark = pytest.mark.idle_clock  # the swarms' deadline waits and back-offs: tests/idle_clock.py


async def test_two_heads_of_one_stage_both_work_every_step_and_equal_the_oracle(oracle_runs):
    spec = spec_for(1)
    swarm = await make_swarm(spec, [2], **patient_options())
    logs = await drive(swarm)
    assert all(log.attempts == 1 for log in logs), [log.attempts for log in logs]
    for log in logs:  # both heads computed microbatches at every step, together all of them once
        assert sorted(log.heads) == ["s0r0", "s0r1"] and min(log.heads.values()) >= 1, (log.step, log.heads)
        assert sum(log.heads.values()) == spec.n_microbatches
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)
    exp = oracle_runs.weights(spec, STEPS)[0]
    for peer in swarm.stage(0):
        for got, w in zip(peer.runner.module.parameters(), exp):
            assert torch.allclose(got.detach(), w, rtol=1e-10, atol=1e-12), f"{peer.peer_id}: weights differ"
    # nothing crossed a boundary: there is none
    assert all(h.daemon.sent_tokens["act"] == 0 for h in swarm.stage(0))


async def test_an_honest_head_of_one_stage_is_checked_from_its_tokens_and_never_convicted(oracle_runs):
    spec = spec_for(1)
    swarm = await make_swarm(spec, [2], **options())
    await drive(swarm)
    leader = leader_of(swarm)
    assert leader.driver.spot.convicted == []
    assert leader.commit.share_check.checks_run >= STEPS  # rate 1: the other head's share, every step


@pytest.mark.parametrize("mode", ["x-50", "random-honest-norm"])
async def test_a_lying_head_of_one_stage_is_banned_and_the_run_equals_the_oracle(mode, oracle_runs):
    spec = spec_for(1)
    swarm = await make_swarm(spec, [3], **options())
    make_liar(swarm.peers[LIAR], mode)
    logs = await drive(swarm)
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, STEPS), 1e-10)
    assert logs[0].heads.get(LIAR, 0) >= 1, "the liar computed no share while it was honest: nothing was tested"
    leader = leader_of(swarm)
    assert leader.peer_id != LIAR and leader.driver.spot.convicted == [LIAR], leader.driver.spot.convicted
    assert all(LIAR not in log.heads for log in logs[LIES_FROM + 1:]), "the banned head still got shares"
    honest = [p for p in swarm.peers if p != LIAR]
    assert len({param_hash(swarm.peers[p].runner) for p in honest}) == 1


async def test_a_one_stage_subspace_swarm_waits_for_no_basis_re_fit(oracle_runs, caplog):
    """Nothing crosses a boundary, so nothing is re-fitted: a head must not wait at every interval for a
    basis update that never comes (it did, 30 s each, before `RunSpec.refits_basis`)."""
    spec = preset("tiny", stages=1, dtype="fp64", wire_dtype="fp64", batch_size=24, microbatch_size=4, lr=1e-3,
                  basis_updates=True, basis_interval=2, basis_switch_delay=1)
    assert not spec.refits_basis and preset("tiny", stages=2, basis_updates=True).refits_basis
    swarm = await make_swarm(spec, [2], **patient_options())
    try:
        with caplog.at_level(logging.WARNING, logger="peer.daemon.basis_gate"):
            logs = await swarm.drive(6)  # switch steps 4 and 6 (a re-fit after steps 2 and 4, taking effect 1 later)
    finally:
        await swarm.stop()
    assert not [r for r in caplog.records if "no basis update arrived" in r.getMessage()]
    assert_close([log.loss for log in logs], oracle_runs.losses(spec, 6), 1e-10)

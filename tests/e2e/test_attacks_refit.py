"""Re-fit only from those who did the work (issue 20, item 5), over real libp2p with attacker
processes: fake ids (their own hivemind nodes, with the run's proof of work) announce themselves
on stages 1 and 2 and send the coordinator bogus re-fit statistics for the real re-fit step before
the swarm's peers start; once the swarm trains, they announce a far step and send statistics for
a far re-fit step. The coordinator publishes
only the honest basis, effective where it chooses (the re-fit step + the switch delay, never the
far step); training goes on past the switch; and the honest statistics are what the basis was
fit from: the swarm's losses equal the oracle's on both sides of the switch, and the coordinator
logs every fake id's statistic as dropped. (Before item 5, 4 fake ids out-voted the honest
replicas and got "basis v1, effective at step 2e13" published: the swarm stalled for good.)

3 stages, subspace codec, basis_interval 5 (re-fit at step 5, effective at step 7), fp32."""
from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import torch

from protocol.basis_update import StatsMessage, decode_update, encode_stats
from protocol.spec import preset
from protocol.wire import KIND_STATS
from swarm.local import LocalOptions, LocalSwarm
from tests.e2e.attacker import Attacker
from tests.e2e.conftest import wait_for_event
from tests.e2e.test_basis_updates import assert_matches

STEPS, FAKES_PER_STAGE = 11, 2
FAR = 2 * 10**13  # a re-fit step (a multiple of 5) the swarm will never reach


async def _send_until_counted(a: Attacker, coordinator: str, stage: int, step: int, M: torch.Tensor,
                              timeout: float = 30.0) -> tuple[str, str]:
    """Send a statistic until the coordinator's view of the DHT holds our announcement (its refusal
    is then for what the statistic says, not for who sends it); returns its last answer."""
    body = encode_stats(StatsMessage(a.spec.run_hash, stage, 0, step, M))
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        code, reason = await a.send(coordinator, KIND_STATS, body)
        if "only peers announced" not in reason:
            return code, reason
        assert asyncio.get_running_loop().time() < deadline, "the coordinator never saw the fake's announcement"
        await asyncio.sleep(0.2)  # poll: the announcement takes a moment to reach the coordinator


async def _bases(a: Attacker, versions: int, timeout: float = 30.0) -> dict[int, bytes]:
    """Every basis update the DHT holds under the swarm key, once it holds `versions` of them."""
    deadline = asyncio.get_running_loop().time() + timeout
    while len(found := await a.sdht.fetch_bases(a.spec.run_hash)) < versions:
        assert asyncio.get_running_loop().time() < deadline, f"the DHT holds basis versions {sorted(found)} only"
        await asyncio.sleep(0.2)  # poll: a stored record takes a moment to be found
    return found


async def test_fake_ids_get_no_basis_published_and_do_not_move_its_effective_step(tmp_path, oracle_runs):
    spec = preset("tiny", codec="subspace", stages=3, basis_interval=5)
    swarm = LocalSwarm(LocalOptions(spec, steps=STEPS, workdir=str(tmp_path / "run"), quiet=True, threads=1))
    fakes: list[Attacker] = []
    try:
        maddrs = await asyncio.to_thread(swarm.start_coordinator)
        async with AsyncExitStack() as stack:
            fakes = list(await asyncio.gather(*(stack.enter_async_context(Attacker(maddrs))
                                                for _ in range(2 * FAKES_PER_STAGE))))
            coordinator = fakes[0].spec.extra["coordinator_peer"]
            shape = (spec.d_model, spec.rank)
            for i, a in enumerate(fakes):
                stage = 1 + i % 2
                await a.announce(stage)
                # the real re-fit step, bogus values, sent before any honest one: held (one per peer), never counted
                code, reason = await _send_until_counted(a, coordinator, stage, 5, torch.randn(shape) * 1e3)
                assert (code, reason) == ("accepted", ""), (code, reason)
            # the honest swarm starts with every fake in place (the fakes stay announced throughout)
            for s in (1, 2):
                swarm.start_peer(s)
            swarm.start_peer(0, "--steps", str(STEPS))
            await asyncio.to_thread(wait_for_event, swarm, "stage0", "step", 120)
            for i, a in enumerate(fakes):  # now a far step, announced: it moves no horizon
                await a.announce(1 + i % 2, step=FAR)
                code, reason = await a.send(coordinator, KIND_STATS, encode_stats(StatsMessage(
                    a.spec.run_hash, 1 + i % 2, 0, FAR, torch.randn(shape))))
                assert (code, "re-fit step being collected" in reason) == ("refused", True), (code, reason)
            # the oracle trains while the swarm does (one torch thread; the same run serves basis_log below)
            oracle = asyncio.create_task(asyncio.to_thread(oracle_runs.losses, spec, STEPS))
            steps = await asyncio.to_thread(wait_for_event, swarm, "stage0", "step", 150, STEPS)
            published = await _bases(fakes[0], 2)  # re-fits at steps 5 and 10
    finally:
        await asyncio.to_thread(swarm.stop)
    oracle_losses = await oracle

    fake_ids = {a.peer_id for a in fakes}
    log = oracle_runs.basis_log(spec, STEPS)
    assert log and log[0] == (1, 5 + spec.basis_switch_delay)
    updates = sorted((decode_update(body, fakes[0].spec) for body in published.values()), key=lambda u: u.version)
    assert [(u.version, u.effective_step) for u in updates] == log[:2], \
        f"published {[(u.version, u.effective_step) for u in updates]}, the oracle's {log}"
    # training went on past the switch, on the basis the honest statistics gave: the oracle's losses
    assert_matches(steps, oracle_losses)
    assert max(s["basis_version"] for s in steps) >= 1 and steps[-1]["step"] == STEPS
    coordinator_log = (swarm.dir / "coordinator.log").read_text()
    dropped = [line for line in coordinator_log.splitlines() if "re-fit at step 5: dropped" in line]
    assert {f[-8:] for f in fake_ids} <= {line.rsplit("from ", 1)[1].split(" ")[0] for line in dropped}, \
        "the coordinator did not log every fake id's statistic as dropped"
    assert "effective at step 20000000000002" not in coordinator_log

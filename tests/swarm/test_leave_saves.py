"""A stop that arrives while a replica is leaving its stage (a SIGTERM during a move to another
stage: `swarm local` stopping the swarm as a peer rebalanced) still writes the stage's checkpoint
(swarm/replicas/replica.py `_leave`): before, the cancellation cut the departure short after
"leaving stage 1" and the stage's trained state was never saved."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from peer.runner.checkpoint import checkpoint_path, load_checkpoint
from swarm.replicas.replica import ReplicaService


def a_leaving_service(folder, stopped: asyncio.Event, release: asyncio.Event):
    announced, unserved = [], []

    async def announce(state):
        announced.append(state)

    async def stop():
        stopped.set()
        await release.wait()  # the daemon drains its last work: the stop arrives meanwhile

    async def unserve(kind):
        unserved.append(kind)

    weights = torch.arange(6, dtype=torch.float64)
    svc = SimpleNamespace(
        peer=SimpleNamespace(announce=announce, stop=stop), stage=1, _saving=None,
        runner=SimpleNamespace(step=40, state_dict=lambda: {"step": 40, "w": weights.clone()}),
        spec=SimpleNamespace(run_hash="8825c0b8d3bf15d6"),
        ctx=SimpleNamespace(checkpoint_dir=str(folder), transport=SimpleNamespace(unserve=unserve)))
    svc._depart = lambda: ReplicaService._depart(svc)
    return svc, announced, unserved


async def test_a_stop_during_the_departure_still_saves_the_stage(tmp_path):
    stopped, release = asyncio.Event(), asyncio.Event()
    svc, announced, unserved = a_leaving_service(tmp_path, stopped, release)
    leaving = asyncio.ensure_future(ReplicaService._leave(svc))
    await asyncio.wait_for(stopped.wait(), 5)
    leaving.cancel()  # the SIGTERM: the CLI cancels the peer's main task
    await asyncio.sleep(0)
    assert not leaving.done(), "the stop cut the departure short"
    release.set()
    with pytest.raises(asyncio.CancelledError):  # the stop still ends the process afterwards
        await asyncio.wait_for(leaving, 5)
    saved = load_checkpoint(checkpoint_path(tmp_path, "8825c0b8d3bf15d6", 1))
    assert saved["step"] == 40 and torch.equal(saved["w"], torch.arange(6, dtype=torch.float64))
    assert announced == ["leaving"] and unserved  # it left the swarm as a plain departure does


async def test_a_second_stop_cuts_the_departure_short(tmp_path):
    stopped, release = asyncio.Event(), asyncio.Event()
    svc, _, _ = a_leaving_service(tmp_path, stopped, release)
    leaving = asyncio.ensure_future(ReplicaService._leave(svc))
    await asyncio.wait_for(stopped.wait(), 5)
    leaving.cancel()
    await asyncio.sleep(0)
    leaving.cancel()  # Ctrl+C twice: the user insists
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(leaving, 5)
    assert not checkpoint_path(tmp_path, "8825c0b8d3bf15d6", 1).exists()

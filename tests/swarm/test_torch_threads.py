"""The CPU threads a bench lets torch use: set for a block and put back, and an in-memory swarm's share of them."""
from __future__ import annotations

import asyncio
import os

import pytest
import torch

import swarm.bench.replicas.replica_sync as replica_sync
from protocol.spec import preset
from swarm.bench.common.machine import per_peer_threads, torch_threads


def test_the_threads_are_put_back_after_the_block_even_when_it_fails():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="boom"), torch_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with torch_threads(0):  # never fewer than one
        assert torch.get_num_threads() == 1


def test_the_cores_are_shared_out_among_peers():
    cores = os.cpu_count() or 1
    assert per_peer_threads(1) == cores and per_peer_threads(0) == cores
    assert per_peer_threads(6) == max(1, cores // 6) and per_peer_threads(10 * cores) == 1


def test_an_in_memory_swarm_trains_on_its_share_of_the_cores(monkeypatch):
    """6 peers in one process: each worker's parallel region starts a team of torch's thread count, so the
    bench gives torch cores / 6 while they train (left at the core count, they oversubscribed the cores)."""
    seen = []

    async def fake_train(spec, replicas, steps, device, data, link_cls):
        seen.append(torch.get_num_threads())
        return None, []

    monkeypatch.setattr(replica_sync, "_train_peers", fake_train)
    before = torch.get_num_threads()
    asyncio.run(replica_sync._train(preset("tiny", stages=3), 2, 1, "cpu", None))
    assert seen == [per_peer_threads(6)] and torch.get_num_threads() == before

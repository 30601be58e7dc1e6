"""A replica the leader convicted stops (swarm/replicas/replica.py): once its commit hears the
abort that names it, the service raises PeerBanned (the CLI prints it and exits 1) instead of
standing by for a step no honest peer will give it; a replica moved by the rebalancer is not."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from swarm.replicas.replica import PeerBanned, ReplicaService


def a_service(serve):
    reports = []
    svc = SimpleNamespace(peer=SimpleNamespace(commit=SimpleNamespace(banned=asyncio.Event())), stage=1,
                          runner=SimpleNamespace(step=7), ctx=SimpleNamespace(report=SimpleNamespace(
                              write=lambda event, **kw: reports.append((event, kw)))))
    svc._serve_until_moved = serve
    return svc, reports


async def test_a_banned_replica_stops_with_the_reason():
    async def forever() -> int:
        await asyncio.Event().wait()  # serves until moved: never, here
        return 0
    svc, reports = a_service(forever)
    running = asyncio.ensure_future(ReplicaService._until_moved_or_banned(svc))
    await asyncio.sleep(0)  # it is serving
    assert not running.done()
    svc.peer.commit.banned.set()
    with pytest.raises(PeerBanned, match="banned this peer for the run"):
        await asyncio.wait_for(running, 5)
    assert reports == [("banned", {"stage": 1, "step": 7})]


async def test_a_moved_replica_is_not_banned():
    async def moved() -> int:
        return 2
    svc, reports = a_service(moved)
    assert await asyncio.wait_for(ReplicaService._until_moved_or_banned(svc), 5) == 2 and reports == []

"""A replica the leader convicted stops (swarm/replicas/replica.py): once its commit hears the
abort that names it, the service raises PeerBanned (the CLI prints it and exits 1) instead of
standing by for a step no honest peer will give it; a replica moved by the rebalancer is not."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from peer.daemon.transfer_time import TOO_SLOW
from protocol.spec import RunSpec
from swarm.replicas.replica import PeerBanned, ReplicaService, ban_message

SLOW = (f"blamed by 2 of the 2 other replicas of stage 1: no contribution arrived from 12345678 within 61.3 s "
        f"({TOO_SLOW})")
FALSE = "the leading head recomputed its share: microbatch 3 differs by 0.5"


def a_service(serve, why=FALSE):
    reports = []
    svc = SimpleNamespace(peer=SimpleNamespace(commit=SimpleNamespace(banned=asyncio.Event(), ban_reason=why)),
                          stage=1, runner=SimpleNamespace(step=7), ctx=SimpleNamespace(
                              spec=RunSpec(slowest_uplink_bps=2e6),
                              report=SimpleNamespace(write=lambda event, **kw: reports.append((event, kw)))))
    svc._serve_until_moved = serve
    return svc, reports


@pytest.mark.parametrize("why", [SLOW, FALSE])
async def test_a_banned_replica_stops_with_the_reason(why):
    async def forever() -> int:
        await asyncio.Event().wait()  # serves until moved: never, here
        return 0
    svc, reports = a_service(forever, why)
    running = asyncio.ensure_future(ReplicaService._until_moved_or_banned(svc))
    await asyncio.sleep(0)  # it is serving
    assert not running.done()
    svc.peer.commit.banned.set()
    with pytest.raises(PeerBanned) as e:
        await asyncio.wait_for(running, 5)
    assert str(e.value) == ban_message(why, 2e6) and why.rstrip(".") in str(e.value)
    assert reports == [("banned", {"stage": 1, "step": 7})]


def test_a_replica_cut_for_its_slow_uplink_is_told_so_and_not_called_a_liar():
    slow, false, silent = ban_message(SLOW, 2e6), ban_message(FALSE, 2e6), ban_message("", 2e6)
    assert "slower than the swarm waits for (2 Mbit/s" in slow and "--slowest-uplink" in slow
    assert "stays banned in this run" in slow and "--identity NEW_FILE" in slow  # the same id would be refused
    assert "computes wrongly" not in slow and "tampering" not in slow
    assert "computes wrongly" in false and "swarm bench share-tolerance" in false and "Mbit/s" not in false
    assert silent.startswith("the leading head banned this peer for the run: it gave no reason.")


async def test_a_moved_replica_is_not_banned():
    async def moved() -> int:
        return 2
    svc, reports = a_service(moved)
    assert await asyncio.wait_for(ReplicaService._until_moved_or_banned(svc), 5) == 2 and reports == []

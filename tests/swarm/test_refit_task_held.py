"""A re-fit's publish awaits the DHT's reply, and hivemind keeps that reply's future only weakly (its
`MPFuture` registry holds weak references), as the event loop keeps its tasks: a re-fit task nobody else
held could be collected mid-publish. Seen in `tests/e2e/test_standby_coordinator.py`: basis version 1 reached
the DHT, but the coordinator never logged it ("Task was destroyed but it is pending!") nor pushed it."""
from __future__ import annotations

import asyncio
import gc
import weakref

from swarm.basis.refit import BasisRefitter
from swarm.trust.keys import SigningKey
from tests.swarm.test_refit_trust import SPEC, FakeDHT, body, stat


class WeakReplyDHT(FakeDHT):
    """Its publish waits for a reply future that only the awaiting task holds, like hivemind's MPFuture."""

    def __init__(self, peers: dict[int, list[str]]) -> None:
        super().__init__(peers)
        self.replies: list[weakref.ref] = []

    async def publish_basis(self, run_hash: str, version: int, body: bytes, ttl: float) -> bool:
        reply = asyncio.get_running_loop().create_future()
        self.replies.append(weakref.ref(reply))
        await reply
        return await super().publish_basis(run_hash, version, body, ttl)


class PushCounter:
    def __init__(self) -> None:
        self.pushed: list[str] = []

    async def request(self, peer, kind, body, timeout=None) -> bytes:
        self.pushed.append(peer)
        return b""


async def test_a_re_fit_waiting_on_the_dhts_reply_survives_a_garbage_collection_and_is_published_and_pushed():
    dht, transport = WeakReplyDHT({1: ["a1"], 2: ["a2"]}), PushCounter()
    refitter = BasisRefitter(SPEC, SigningKey.generate(), dht, transport, ttl=60)
    assert await refitter.on_stats(body(1, 5, stat(1)), "a1") == b""
    assert await refitter.on_stats(body(2, 5, stat(2)), "a2") == b""
    for _ in range(50):  # until the re-fit task awaits the reply
        if dht.replies:
            break
        await asyncio.sleep(0)
    assert dht.replies, "the re-fit never reached its publish"
    gc.collect()
    reply = dht.replies[0]()
    assert reply is not None, "the re-fit task was collected while it waited for the DHT"
    reply.set_result(None)
    del reply
    for _ in range(50):
        if transport.pushed:
            break
        await asyncio.sleep(0)
    assert dht.published == [1] and [u.version for u in refitter.published] == [1]
    assert sorted(transport.pushed) == ["a1", "a2"], "the update was not pushed to the stages' peers"
    refitter.stop()

"""The dial-back check between real libp2p daemons on loopback: a helper's fresh probe host
connects to the asker where it listens, and fails where nothing of the asker listens."""
from __future__ import annotations

import asyncio
import socket

import pytest

from swarm.dht import close_node, start_dht
from swarm.net import Transport
from swarm.net.reachability import DialBack, check_reachability

NAMESPACE = "subspace-swarm-test"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free once closed: nothing listens there


@pytest.mark.e2e
async def test_dialback_between_real_daemons():
    helper_dht = await asyncio.to_thread(start_dht, [], ["/ip4/127.0.0.1/tcp/0"])
    helper_p2p = helper = asker_dht = asker_p2p = asker = None
    try:
        helper_p2p = await helper_dht.replicate_p2p()
        helper = Transport(helper_p2p, NAMESPACE)
        await DialBack(timeout=5.0).serve(helper)
        entry = [str(m) for m in helper_dht.get_visible_maddrs()]
        asker_dht = await asyncio.to_thread(start_dht, entry, ["/ip4/127.0.0.1/tcp/0"])
        asker_p2p = await asker_dht.replicate_p2p()
        asker = Transport(asker_p2p, NAMESPACE)
        helper_id = helper_p2p.peer_id.to_base58()
        mine = [str(m) for m in asker_dht.get_visible_maddrs()]

        assert await check_reachability(asker, [helper_id], mine) is True
        assert await check_reachability(asker, [helper_id], [f"/ip4/127.0.0.1/tcp/{closed_port()}"]) is False
        # a helper that does not answer (no such peer) gives no verdict at all
        assert await check_reachability(asker, ["QmNotAPeer"], mine) is None
    finally:
        if asker_dht is not None:
            await close_node(asker_dht, asker_p2p, asker)
        await close_node(helper_dht, helper_p2p, helper)

"""LivenessProbe over real p2pd daemons on 127.0.0.1: what counts as an answer, and what does not."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hivemind.p2p import P2P

from protocol.control import decode_command
from protocol.wire import KIND_CONTROL
from swarm.monitor.liveness import LivenessProbe
from swarm.net.transport import Transport

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
RUN = "0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e  # real p2pd daemons

# A peer's process serving control commands over a p2pd it does not own (as a peer's transport
# does over its DHT's p2pd), so that the process can die while its p2pd lives on.
HANDLER_PROCESS = textwrap.dedent(f"""
    import asyncio, sys
    sys.path.insert(0, {str(ROOT)!r})
    from hivemind.p2p import P2P
    from hivemind.utils.multiaddr import Multiaddr
    from swarm.net.transport import Transport

    async def main():
        p2p = await P2P.replicate(Multiaddr(sys.argv[1]))
        transport = Transport(p2p, "subspace-swarm-{RUN}")
        async def refuse(body, peer):
            raise RuntimeError("only the leading head drives the steps")
        await transport.serve("ctl", refuse)
        print("serving", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


@pytest.fixture
async def daemons():
    started: list[P2P] = []
    try:
        server = await P2P.create(host_maddrs=LOCAL)
        started.append(server)
        maddrs = [str(m) for m in await server.get_visible_maddrs()]
        client = await P2P.create(initial_peers=maddrs, host_maddrs=LOCAL)
        started.append(client)
        yield server, client
    finally:
        for p2p in started:
            await p2p.shutdown()


async def test_a_reply_or_a_refusal_is_an_answer(daemons):
    server, client = daemons
    asked = []

    async def status(body: bytes, peer: str) -> bytes:
        asked.append(decode_command(body, RUN).op)
        return b"ok"

    served = Transport(server, f"subspace-swarm-{RUN}")
    try:
        await served.serve(KIND_CONTROL, status)
        probe = LivenessProbe(client)
        assert await probe.answers(RUN, server.peer_id.to_base58()) and asked == ["status"]
    finally:
        await served.close()

    async def refuse(body: bytes, peer: str) -> bytes:
        raise RuntimeError("this swarm is private")

    served = Transport(server, f"subspace-swarm-{RUN}")
    try:
        await served.serve(KIND_CONTROL, refuse)
        assert await LivenessProbe(client).answers(RUN, server.peer_id.to_base58()), "a refusal is an answer"
    finally:
        await served.close()


async def test_a_host_that_serves_no_control_yet_answers(daemons):
    server, client = daemons  # a peer still joining: its p2pd is up, its handlers are not registered yet
    assert await LivenessProbe(client).probe_all(RUN, [server.peer_id.to_base58()]) == {
        server.peer_id.to_base58(): True}


async def test_a_stalled_handler_a_stopped_p2pd_and_a_bad_id_are_no_answer(daemons):
    server, client = daemons
    release = asyncio.Event()

    async def stall(body: bytes, peer: str) -> bytes:
        await release.wait()
        return b"late"

    served = Transport(server, f"subspace-swarm-{RUN}")
    try:
        await served.serve(KIND_CONTROL, stall)
        peer = server.peer_id.to_base58()
        assert await LivenessProbe(client, timeout=0.5).probe_all(RUN, [peer, "not-a-peer-id"]) == {
            peer: False, "not-a-peer-id": False}
    finally:
        release.set()
        await served.close()
    await server.shutdown()
    assert not await LivenessProbe(client).answers(RUN, peer), "a stopped host's port refuses"


async def test_a_killed_process_behind_a_live_p2pd_is_no_answer(daemons):
    server, client = daemons
    process = subprocess.Popen([sys.executable, "-c", HANDLER_PROCESS, str(server._daemon_listen_maddr)],
                               stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 60)
        assert line.strip() == "serving"
        peer = server.peer_id.to_base58()
        assert await LivenessProbe(client).answers(RUN, peer), "its handler refuses: alive"
    finally:
        process.kill()
        process.wait(10)
    assert not await LivenessProbe(client).answers(RUN, peer), "the p2pd lives, the peer's process is gone"

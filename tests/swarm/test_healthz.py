"""`/healthz` of a peer: 200 only while online, 503 while joining or leaving; a taken port is one sentence."""
from __future__ import annotations

import socket

import aiohttp
import pytest

from swarm.monitor.healthz import HealthzServer
from swarm.monitor.peer_monitor import PeerMonitor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def get(port: int) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/healthz") as r:
            return r.status, await r.json()


async def test_status_code_follows_the_state():
    state = {"state": "online", "stage": 1, "step": 7}
    server = HealthzServer(lambda: dict(state), free_port())
    await server.start()
    try:
        assert await get(server.port) == (200, state)
        state["state"] = "leaving"
        status, body = await get(server.port)
        assert status == 503 and body["state"] == "leaving"
    finally:
        await server.close()


async def test_a_joining_peer_monitor_answers_503_and_closes_its_port():
    monitor = PeerMonitor(health_port=free_port())
    await monitor.start()
    port = monitor._healthz.port
    try:
        status, body = await get(port)
        assert status == 503 and body == {"state": "joining", "stage": None, "step": 0, "peer_id": None, "run": None}
    finally:
        await monitor.close()
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(port)


async def test_a_taken_port_is_one_clear_sentence():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = HealthzServer(lambda: {"state": "online"}, taken.getsockname()[1])
        with pytest.raises(RuntimeError, match=r"^port \d+ is taken; pass another --health-port\.$"):
            await server.start()

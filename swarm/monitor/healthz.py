"""`/healthz`: a peer's tiny local status endpoint, for Docker and systemd health checks.

`swarm peer --health-port 8081` serves `GET /healthz` on 127.0.0.1 (or `--health-host`):

    {"state": "online", "stage": 1, "step": 42, "peer_id": "12D3Koo...", "run": "5f0c..."}

with status 200 while the peer is online and 503 while it is joining or leaving, so that
`curl -fsS localhost:8081/healthz` is a complete health check. It reads what the peer already
knows (a callable returning that dict) and never touches the DHT.
"""
from __future__ import annotations

import errno
from collections.abc import Callable

from aiohttp import web


class HealthzServer:
    def __init__(self, status: Callable[[], dict], port: int, host: str = "127.0.0.1") -> None:
        self.status, self.port, self.host = status, port, host
        self._runner: web.AppRunner | None = None

    async def _healthz(self, request: web.Request) -> web.Response:
        body = self.status()
        return web.json_response(body, status=200 if body.get("state") == "online" else 503,
                                 headers={"Cache-Control": "no-store"})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError as e:
            await runner.cleanup()
            if e.errno == errno.EADDRINUSE:
                raise RuntimeError(f"port {self.port} is taken; pass another --health-port.") from None
            raise RuntimeError(f"cannot serve /healthz on {self.host}:{self.port} ({e.strerror}).") from None
        self._runner = runner

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

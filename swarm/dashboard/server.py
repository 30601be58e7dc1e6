"""`swarm dashboard`: the swarm's health in a browser, as JSON, and for Prometheus.

It joins the swarm's DHT as a client (it hosts nothing and stores nothing), samples it every
second (`state.py`), probes every listed peer over libp2p every ~2 s (one small "status"
command each, `swarm/monitor/liveness.py`: a killed peer shows offline within ~5 s, long
before its records expire) and serves, with aiohttp, everything from this package (no CDN):

    GET /                 the page (static/index.html, app.js, style.css, vendor/uPlot)
    GET /api/v1/state     the latest snapshot as JSON (below); the page polls it every 1.5 s
    GET /metrics          Prometheus text format (metrics.py)

`/api/v1/state` (numbers measured by the peers themselves; null where unknown):

    updated            unix time of the snapshot
    error              null, or one sentence (no run spec yet in the DHT or at the peers asked, DHT trouble)
    run                null, or {hash, name, codec, rank (boundary width: d, k or b), stages,
                       stage_layers, d_model, n_layers, vocab, seq_len, batch_size, wire_dtype,
                       quant, basis_interval, replica_sync (exact|powersgd), replica_sync_rank,
                       key (the coordinator key's fingerprint)}
    stages             [{stage, layers, peers (online), tokens_per_s (sum of its online peers),
                         covered, bottleneck (uncovered; else the slowest, if below 90% of the
                         fastest)}]
    peers              [{peer_id, stage, state (joining|syncing|online|paused|leaving|offline|unannounced),
                         online (announced, online and answering: what counts for coverage),
                         answers (true: answered the last probe; false: missed it; null: not
                         probed yet), announced, age_s
                         (since its newest record), health (has a valid health record), key
                         (fingerprint of its health key), tokens_per_s (passed on), standby (a
                         head that does not lead) and measured_tokens_per_s (its announced compute
                         speed, peer/step/calibration.py; null unless standby), queue, basis_version,
                         version, and from its health record: step, loss, bytes_in_per_s,
                         bytes_out_per_s, forward_bytes_per_token, backward_bytes_per_token,
                         sync_bytes_per_step (replica-sync bytes sent per step taken with
                         other replicas; null if none yet), codec, rank, basis_updated_step,
                         device, memory_bytes, peak_memory_bytes, uptime_s, reachability (direct|relayed), refused,
                         banned {peer: failures}, checkpoint_error (its last failed checkpoint write, or null)}]
                       ("offline": missed two probes in a row, or no live record now; such a
                        row is listed for 60 s (presence.OFFLINE_KEEP_S) after the peer went
                        offline; "unannounced": a health record without a stage announcement)
    banned             [{peer_id, failures, reported_by: [peer ids], for_run (banned for the run, listed first),
                         reason (the leader's, or null)}] from the peers' routers and health records
                       (banned, wire, basis and series use announced peers' records only)
    wire               {forward_bytes_per_token, backward_bytes_per_token,
                        dense_bytes_per_token, compression_ratio (dense / forward),
                        sync_bytes_per_step (the busiest replica's; null without replicas),
                        replica_sync (the run's mode)}
    basis              {version, updated_step, mixed (online peers disagree)}
    coordinator        {peer (the seat's holder, else the newest claim's, else the run spec's), seat_held (false:
                        no coordinator holds the seat; the page says so), term, since (unix time its term began;
                        term and since null while no claim is live)}
    series             {loss: {time, step, value}, tokens_per_s: {time, step, value}}
                       (bounded: the last 2000 points each; loss per training step)
    invalid_records    distinct malformed, forged or misfiled health records seen (ignored)
    problems           the last reasons such records were ignored
"""
from __future__ import annotations

import asyncio
import errno
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from swarm.dht import SwarmDHT, close_node, start_dht
from swarm.dht.record_service import spec_asker
from swarm.monitor.liveness import LivenessProbe
from swarm.monitor.reader_ticket import ReaderTicket
from swarm.monitor.scalars import ScalarLog
from swarm.options import opt

from .metrics import make_registry, render
from .state import DashboardState

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
# Only this server's own scripts and styles; uPlot sets element styles from script, hence 'unsafe-inline' for styles.
CSP = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'"


@dataclass
class DashboardOptions:
    """What `swarm dashboard` can be told; each field is also its flag."""

    initial_peers: list[str] = opt([], "address of the coordinator or any peer of the swarm", metavar="MADDR",
                                   required=True)
    port: int = opt(8080, "HTTP port")
    host: str = opt("127.0.0.1", "address to listen on (0.0.0.0 to share it on your network)")
    trusted_key: str | None = opt(None, "only trust a run spec signed by this public key", flag="--swarm-key",
                                  metavar="HEX")
    identity: str | None = opt(None, "private swarms with no coordinator up: the identity file --ticket was issued to",
                               metavar="FILE")
    ticket: str | None = opt(None, "private swarms with no coordinator up: a ticket from `swarm admit` (or a file "
                             "holding it), with which the peers re-serve the run spec", metavar="TICKET")
    tensorboard: str | None = opt(None, "also write the sampled swarm scalars here", metavar="DIR")
    url_file: str | None = opt(None, "write {\"url\": ...} here once serving (used by `swarm local`)",
                               metavar="FILE", hidden=True)
    interval: float = 1.0


class Dashboard:
    """The web app over a (possibly not yet started) DashboardState."""

    def __init__(self) -> None:
        self.state: DashboardState | None = None
        self.registry = make_registry(self.snapshot)

    def snapshot(self) -> dict:
        if self.state is None:
            return {"updated": None, "error": "connecting to the swarm's DHT...", "run": None, "stages": [],
                    "peers": [], "banned": [], "wire": None, "basis": None, "coordinator": None,
                    "series": {"loss": {"time": [], "step": [], "value": []},
                               "tokens_per_s": {"time": [], "step": [], "value": []}},
                    "invalid_records": 0, "problems": []}
        return self.state.snapshot()

    async def _index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def _favicon(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "favicon.svg")

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(self.snapshot(), headers={"Cache-Control": "no-store"})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=render(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def app(self) -> web.Application:
        @web.middleware
        async def headers(request: web.Request, handler):
            response = await handler(request)
            response.headers.setdefault("Content-Security-Policy", CSP)
            response.headers.setdefault("X-Content-Type-Options", "nosniff")
            return response

        app = web.Application(middlewares=[headers])
        app.router.add_get("/", self._index)
        app.router.add_get("/api/v1/state", self._state)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/favicon.ico", self._favicon)
        app.router.add_static("/static/", STATIC)
        return app


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        await runner.cleanup()
        if e.errno == errno.EADDRINUSE:
            raise RuntimeError(f"port {port} is taken; pass another with --port.") from None
        raise RuntimeError(f"cannot serve the dashboard on {host}:{port} ({e.strerror}).") from None
    return runner


async def run_dashboard(opts: DashboardOptions, reader: ReaderTicket | None = None) -> int:
    """Serve the dashboard until cancelled; stops its DHT client (and p2pd) on the way out. `reader`: the identity
    and ticket to read a private swarm with, if already read from `opts` (`ReaderTicket.read`)."""
    reader = reader or ReaderTicket.read(opts.identity, opts.ticket)  # a bad pair: one sentence, nothing started
    dashboard = Dashboard()
    runner = await serve(dashboard.app(), opts.host, opts.port)  # first, so a taken port fails fast
    dht = p2p = task = scalars = asking = None
    try:
        url = f"http://{'127.0.0.1' if opts.host in ('0.0.0.0', '') else opts.host}:{opts.port}/"
        dht = await asyncio.to_thread(start_dht, opts.initial_peers, ["/ip4/127.0.0.1/tcp/0"], reader.identity, True)
        p2p = await dht.replicate_p2p()  # for the liveness probes; it serves nothing
        # the run spec, with no coordinator up (a private swarm's peers re-serve it to ticket holders only)
        peers, asking = await spec_asker(dht, opts.initial_peers, reader.request_bytes())
        scalars = ScalarLog(opts.tensorboard) if opts.tensorboard else None
        dashboard.state = DashboardState(SwarmDHT(dht), interval=opts.interval, scalars=scalars,
                                         trusted_key=bytes.fromhex(opts.trusted_key) if opts.trusted_key else None,
                                         probe=LivenessProbe(p2p), peers=peers)
        task = asyncio.create_task(dashboard.state.run())
        if opts.url_file:
            Path(opts.url_file).write_text(json.dumps({"url": url}))
        log.info("dashboard at %s", url)
        print(f"dashboard: {url}", flush=True)
        await task
        return 0
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if scalars is not None:
            scalars.close()
        if asking is not None:
            await asking.close()
        await runner.cleanup()
        if dht is not None:
            await close_node(dht, p2p)

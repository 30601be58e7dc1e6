"""One peer process, wired together: DHT + libp2p transport + router around a StageDaemon.

`run_peer(options)` joins the swarm, reads and verifies the run spec, refuses to join if its
shared constants (U, T_fixed) hash differently from the coordinator's, builds its stage,
announces itself by heartbeat, serves, and (as a head) drives the steps. Whatever happens,
it leaves the swarm cleanly: announcement "leaving", handlers removed, p2pd stopped.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from peer.daemon import StageDaemon, StepLog
from peer.data import BatchSource, load_corpus
from peer.interfaces import LinkError
from peer.stage import StageRunner
from protocol.model import spec_basis
from protocol.spec import RunSpec
from protocol.wire import WireLimits

from .basis import BasisSync
from .dht import SwarmDHT, close_node, start_dht
from .monitor.peer_monitor import PeerMonitor
from .net import HomeLink, Transport, TransportError
from .options import opt
from .router import Router

log = logging.getLogger(__name__)


class JoinError(RuntimeError):
    """This peer cannot join the swarm; the message says what to do."""


@dataclass
class PeerOptions:
    """Everything `swarm peer` can be told; each field is also its flag (`swarm/options.py`)."""

    initial_peers: list[str] = opt([], "address of the coordinator or any peer of the swarm", metavar="MADDR",
                                   required=True)
    stage: str = opt("auto", "stage to host, or auto (the least covered)")
    device: str = opt("cpu", "torch device, e.g. cuda:0")
    steps: int | None = opt(None, "head only: stop after this many steps (default: run until stopped)")
    data: str | None = opt(None, "head only: text file or folder (default: embedded corpus)", metavar="PATH")
    host_maddrs: list[str] = opt(["/ip4/0.0.0.0/tcp/0"], "libp2p listen addresses", metavar="MADDR")
    identity: str | None = opt(None, "libp2p identity file for a stable peer id", metavar="FILE")
    checkpoint_dir: str | None = opt(None, "save this stage's state here when stopping", metavar="DIR")
    resume: bool = opt(False, "resume from the checkpoint in --checkpoint-dir")
    bandwidth: str | None = opt(None, "emulated home connection: uplink and downlink of this rate, each shared by "
                                "all of this peer's traffic, e.g. 80mbit (benchmarks)")
    latency: str = opt("0", "emulated one-way latency of every frame this peer sends, e.g. 20ms (benchmarks)")
    report: str | None = opt(None, "append JSON-lines events (steps, wire counters) here", metavar="FILE")
    trusted_key: str | None = opt(None, "only trust a run spec signed by this public key (or its fingerprint)",
                                  flag="--swarm-key", metavar="HEX")
    threads: int | None = opt(None, "torch intra-op threads")
    join_timeout: float = opt(60.0, "seconds to wait for the run spec and for every stage to be covered")
    step_timeout: float = opt(120.0, "seconds a step may take before it is given up")
    ttl: float = 15.0  # seconds an announcement lives without a heartbeat
    health_port: int = opt(0, "serve GET /healthz on this port for Docker/systemd health checks (default: off)")
    health_host: str = opt("127.0.0.1", "address /healthz listens on")
    tensorboard: str | None = opt(None, "head/tail: per-step loss, tokens/s and wire bytes per token for "
                                  "TensorBoard", metavar="DIR")


class LinkAdapter:
    """The daemon's MessageLink over our Transport: transport failures become LinkError."""

    def __init__(self, transport: Transport, peer_id: str) -> None:
        self.transport, self.peer_id = transport, peer_id

    async def serve(self, kind, handler) -> None:
        await self.transport.serve(kind, handler)

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        try:
            return await self.transport.request(peer, kind, body, timeout)
        except TransportError as e:
            raise LinkError(str(e)) from e


class Reporter:
    """Appends one JSON object per line to the report file (if any) and flushes it at once."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.listeners: list[Callable[[str, dict], None]] = []  # e.g. the health monitor, for the head's steps

    def write(self, event: str, **fields) -> None:
        for listener in self.listeners:
            listener(event, fields)
        if not self.path:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


async def fetch_spec(sdht: SwarmDHT, trusted_key: str | None, timeout: float) -> RunSpec:
    deadline = time.monotonic() + timeout
    try:
        pinned = bytes.fromhex(trusted_key) if trusted_key else None
    except ValueError:
        raise JoinError("--swarm-key must be the coordinator's key fingerprint or public key, in hex.") from None
    key = pinned if pinned is not None and len(pinned) > 8 else None  # a fingerprint is 8 bytes
    while True:
        signed = await sdht.fetch_run_spec(key)
        if signed is not None and pinned is not None and key is None and signed.fingerprint != trusted_key.lower():
            raise JoinError(f"the run spec is signed by key {signed.fingerprint}, not by the pinned {trusted_key}.")
        if signed is not None:
            spec = RunSpec.from_json(signed.spec_json)
            if spec.coordinator_key and spec.coordinator_key != signed.public_key.hex():
                raise JoinError("the run spec names a coordinator key other than the one that signed it; "
                                "this swarm is misconfigured or under attack.")
            log.info("joined run %s (%s), signed by %s", spec.run_hash, spec.name, signed.fingerprint)
            return spec
        if time.monotonic() > deadline:
            raise JoinError(f"no run spec found in the DHT after {timeout:g} s; check --initial-peers "
                            f"(the coordinator's address) and that the coordinator is running.")
        await asyncio.sleep(0.5)  # poll the DHT for the spec while the coordinator comes up


def check_shared_constants(spec: RunSpec) -> None:
    want = spec.extra.get("basis_hash")
    if spec.codec != "subspace" or not want:
        return
    have = spec_basis(spec).hash()
    if have != want:
        raise JoinError(f"this machine generates shared constants with hash {have}, the swarm has {want}; "
                        f"install the same torch version as the coordinator (torch {torch.__version__} here).")


async def choose_stage(router: Router, spec: RunSpec, requested: str) -> int:
    if requested != "auto":
        stage = int(requested)
        if not 0 <= stage < spec.n_stages:
            raise JoinError(f"--stage {stage} does not exist: this run has stages 0..{spec.n_stages - 1}.")
        return stage
    counts = [len(await router.live_peers(s, fresh=True)) for s in range(spec.n_stages)]
    return min(range(spec.n_stages), key=lambda s: (counts[s], s))


def _checkpoint_path(opts: PeerOptions, spec: RunSpec, stage: int) -> Path | None:
    if not opts.checkpoint_dir:
        return None
    return Path(opts.checkpoint_dir) / f"{spec.run_hash}-stage{stage}.pt"


def _wire_summary(transport: Transport, daemon: StageDaemon) -> dict:
    out = {kind: transport.bytes_sent(kind) for kind in ("act", "grad")}
    link = transport.link.stats() if transport.link is not None else None
    return {"bytes_out": out, "tokens_out": dict(daemon.sent_tokens), "refused": daemon.refused,
            "bytes_sent": transport.bytes_sent(), "bytes_received": transport.bytes_received(), "link": link,
            "tokens_done": daemon.tokens_done}


async def run_peer(opts: PeerOptions) -> int:
    """Run one peer until its steps are done (head) or it is cancelled; returns an exit code."""
    reporter = Reporter(opts.report)
    dht = await asyncio.to_thread(start_dht, opts.initial_peers, opts.host_maddrs, opts.identity)
    p2p = transport = daemon = router = None
    monitor = PeerMonitor(opts.health_port, opts.health_host, opts.tensorboard)  # health record, /healthz, TensorBoard
    tasks: list[asyncio.Task] = []
    try:
        await monitor.start()  # /healthz answers "joining" (503) from here on
        sdht = SwarmDHT(dht)
        spec = await fetch_spec(sdht, opts.trusted_key, opts.join_timeout)
        check_shared_constants(spec)
        p2p = await dht.replicate_p2p()
        peer_id = p2p.peer_id.to_base58()
        limits = WireLimits.for_spec(spec)
        link = HomeLink.from_strings(opts.bandwidth, opts.latency) if (
            opts.bandwidth or opts.latency not in ("0", "", None)) else None
        transport = Transport(p2p, f"subspace-swarm-{spec.run_hash}", max_frame_bytes=limits.max_bytes,
                              timeout=opts.step_timeout, link=link)
        maddrs = [str(m) for m in dht.get_visible_maddrs()]
        router = Router(sdht, spec.run_hash, peer_id, maddrs, ttl=opts.ttl)
        stage = await choose_stage(router, spec, opts.stage)
        runner = await asyncio.to_thread(StageRunner, spec, stage, opts.device)
        ckpt = _checkpoint_path(opts, spec, stage)
        if opts.resume and ckpt and ckpt.exists():
            runner.load_state_dict(torch.load(ckpt, map_location=opts.device, weights_only=False))
            log.info("resumed stage %d at step %d from %s", stage, runner.step, ckpt)
        batches = None
        if stage == 0:
            corpus = load_corpus(opts.data, seq_len=spec.seq_len)
            batches = BatchSource(corpus, spec.seq_len, spec.microbatch_size, spec.data_seed).microbatch
        sync = BasisSync(spec, sdht, transport)
        daemon = StageDaemon(runner, LinkAdapter(transport, peer_id), router, batches=batches,
                             step_timeout=opts.step_timeout, on_refit=sync.send_stats, verify_update=sync.verify,
                             pull_updates=sync.pull)
        sync.daemon = daemon
        await sync.catch_up(daemon)
        await daemon.start()
        monitor.attach(sdht, spec, peer_id, maddrs, transport, daemon, router, opts.device)
        reporter.listeners.append(monitor.on_event)
        tasks.append(asyncio.create_task(_heartbeat(router, daemon, opts.ttl, sync, monitor)))
        log.info("peer %s serves stage %d of run %s at %s", peer_id, stage, spec.run_hash, maddrs[0] if maddrs else "?")
        reporter.write("ready", stage=stage, peer_id=peer_id, run=spec.run_hash, maddrs=maddrs)
        if stage == 0:
            await _drive(daemon, router, spec, opts, reporter, transport)
        else:
            await asyncio.Event().wait()  # serve until cancelled
        return 0
    finally:
        # A second Ctrl+C may cancel this cleanup halfway: the report goes first (no await), and
        # the daemons are stopped in a `finally` of their own so that no p2pd is left behind.
        if daemon is not None:
            reporter.write("wire", stage=daemon.stage, **_wire_summary(transport, daemon))
        try:
            for t in tasks:
                t.cancel()
            await monitor.close()  # /healthz says "leaving" (503), then stops
            if router is not None and daemon is not None:
                try:
                    await asyncio.wait_for(router.announce(daemon.status("leaving")), 3.0)
                except Exception:  # leaving is best effort: the record expires anyway
                    pass
            if daemon is not None:
                await daemon.stop()
                ckpt = _checkpoint_path(opts, daemon.spec, daemon.stage)
                if ckpt is not None:
                    ckpt.parent.mkdir(parents=True, exist_ok=True)
                    torch.save(daemon.runner.state_dict(), ckpt)
        finally:
            await close_node(dht, p2p, transport)


async def _heartbeat(router: Router, daemon: StageDaemon, ttl: float, sync: BasisSync,
                     monitor: PeerMonitor | None = None) -> None:
    if monitor is not None:
        await monitor.publish(ttl)  # at once, so that dashboards see the peer without waiting a beat
    while True:
        await asyncio.sleep(ttl / 3)
        if monitor is not None:
            await monitor.publish(ttl)  # never raises: a failed publish is logged and retried next beat
        try:
            await router.announce(daemon.status("online"))
            await sync.pull()
        except Exception as e:  # a DHT hiccup must not kill the peer; the next beat retries
            log.warning("heartbeat failed: %s", e)


async def _drive(daemon: StageDaemon, router: Router, spec: RunSpec, opts: PeerOptions, reporter: Reporter,
                 transport: Transport) -> None:
    counts = await router.wait_for_coverage(spec.n_stages, opts.join_timeout)
    log.info("every stage is covered (%s); training", counts)
    reporter.write("start", peers_per_stage=counts)
    done = 0
    while opts.steps is None or done < opts.steps:
        record: StepLog = await daemon.train_step()
        done += 1
        # the head's own first boundary, counted from the transport: what a progress bar can show
        wire = transport.bytes_sent("act") / max(1, daemon.sent_tokens["act"])
        reporter.write("step", **asdict(record), forward_bytes_per_token=wire)
        log.info("step %d loss %.4f %.0f tok/s", record.step, record.loss, record.tokens / max(record.seconds, 1e-9))
    reporter.write("done", steps=done)


def configure_torch(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

"""What a running peer says about itself: its signed health record, `/healthz`, TensorBoard.

`run_peer` makes one `PeerMonitor` as it starts (so `/healthz` answers 503 "joining" while
the peer looks for the swarm), attaches the live parts once its stage serves, lets the
heartbeat call `publish()` on every beat, and closes it as the peer leaves.

Per-step figures: the head hands over its exact step records (as a `Reporter` listener); a
tail has no step loop of its own, so a small task notices its optimizer steps by polling the
runner's step counter, and reports the loss of the last microbatch it saw for that step.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import torch

from peer.commit.commit import StepCommit
from peer.daemon.daemon import StageDaemon
from protocol.spec import RunSpec
from protocol.wire import KIND_ACTIVATION as KIND_FORWARD
from protocol.wire import KIND_GRADIENT as KIND_BACKWARD
from protocol.wire import KIND_REDUCE
from swarm import __version__
from swarm.dht import SwarmDHT
from swarm.net.transport import Transport

from .health import MAX_BANNED, MAX_HISTORY, MAX_REASON, HealthRecord, publish_health, reachability_of
from .healthz import HealthzServer
from .scalars import ScalarLog

log = logging.getLogger(__name__)

STEP_POLL_S = 0.1  # how often a tail looks at its step counter (steps take >= ~0.1 s even on tiny models)


class BanBook(Protocol):
    """What the monitor reads of the peer's router (`swarm/replicas/router.py`, a room above this one)."""

    def banned_peers(self) -> dict[str, int]: ...

    def run_bans_listed(self) -> dict[str, str]: ...


@dataclass
class _Attached:
    sdht: SwarmDHT
    spec: RunSpec
    peer_id: str
    maddrs: list[str]
    transport: Transport
    daemon: StageDaemon
    router: BanBook
    device: str
    commit: StepCommit | None = None


@dataclass
class _Totals:
    """Counters at the previous beat, so that a record carries rates over the last beat."""

    time: float
    bytes_in: int
    bytes_out: int
    tokens: int


def device_and_memory(device: str) -> tuple[str, int]:
    """(device name, bytes in use): GPU name and allocated memory, or "cpu" and this process's RSS."""
    if device.startswith("cuda") and torch.cuda.is_available():
        dev = torch.device(device)
        return torch.cuda.get_device_name(dev)[:128], int(torch.cuda.memory_allocated(dev))
    return (device if device not in ("", "cpu") else "cpu")[:128], _rss_bytes()


def peak_memory(device: str) -> int:
    """The most memory this peer held: `torch.cuda.max_memory_allocated` on a GPU (its stage's tensors,
    what `peer/runner/memory_estimate.py` estimates), else the process's peak resident set (all of Python,
    torch and the DHT with it)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated(torch.device(device)))
    return _peak_rss_bytes()


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_rss_bytes()  # not Linux: the peak is the best the standard library offers


def _peak_rss_bytes() -> int:
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


class PeerMonitor:
    def __init__(self, health_port: int = 0, health_host: str = "127.0.0.1", tensorboard: str | None = None) -> None:
        self.state = "joining"
        self.checkpoint_error = ""  # set by the replica when a checkpoint write fails; in every record after
        self.started = time.monotonic()
        self.tensorboard = tensorboard
        self.published = 0
        self._peer: _Attached | None = None
        self._healthz = HealthzServer(self.healthz_status, health_port, health_host) if health_port else None
        self._scalars: ScalarLog | None = None
        self._history: deque[list[float]] = deque(maxlen=MAX_HISTORY)
        self._last: _Totals | None = None
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        if self._healthz is not None:
            await self._healthz.start()

    def attach(self, sdht: SwarmDHT, spec: RunSpec, peer_id: str, maddrs: list[str], transport: Transport,
               daemon: StageDaemon, router: BanBook, device: str, commit: StepCommit | None = None) -> None:
        """The stage serves: from now on the monitor reports it, and says "online"."""
        self._peer = _Attached(sdht, spec, peer_id, maddrs, transport, daemon, router, device, commit)
        self.state = "online"
        if self.tensorboard and self._scalars is None:
            self._scalars = ScalarLog(self.tensorboard)
        if self._watch is not None:  # attached before, to another stage this peer has left
            self._watch.cancel()
            self._watch = None
        if daemon.runner.is_last and not daemon.runner.is_first:
            self._watch = asyncio.create_task(self._watch_tail_steps())

    async def close(self) -> None:
        self.state = "leaving"
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self._scalars is not None:
            self._scalars.close()
        if self._healthz is not None:
            await self._healthz.close()

    # ------------------------------------------------------------------ /healthz
    def healthz_status(self) -> dict:
        p = self._peer
        return {"state": self.state, "stage": p.daemon.stage if p else None, "step": p.daemon.runner.step if p else 0,
                "peer_id": p.peer_id if p else None, "run": p.spec.run_hash if p else None}

    # ------------------------------------------------------------------ steps
    def on_event(self, event: str, fields: dict) -> None:
        """A `Reporter` listener: the head's exact step records."""
        if event == "step" and self._peer is not None:
            tokens_per_s = fields["tokens"] / max(fields["seconds"], 1e-9)
            self._on_step(int(fields["step"]), fields["loss"], tokens_per_s)

    def _on_step(self, step: int, loss: float | None, tokens_per_s: float | None) -> None:
        loss = _finite(loss)
        if loss is not None:
            self._history.append([step, loss, time.time()])
        if self._scalars is not None:
            self._scalars.write(step, {"loss": loss, "tokens_per_s": tokens_per_s,
                                       "wire_bytes_per_token": self._own_bytes_per_token()})

    def _own_bytes_per_token(self) -> float | None:
        p = self._peer
        kind = KIND_BACKWARD if p.daemon.runner.is_last else KIND_FORWARD
        tokens = p.daemon.sent_tokens[kind]
        return p.transport.bytes_sent(kind) / tokens if tokens else None

    async def _watch_tail_steps(self) -> None:
        daemon = self._peer.daemon
        tokens_per_step = self._peer.spec.batch_size * self._peer.spec.seq_len
        seen, since = daemon.runner.step, time.monotonic()
        while True:
            await asyncio.sleep(STEP_POLL_S)
            now, step = time.monotonic(), daemon.runner.step
            if step > seen:
                tokens_per_s = tokens_per_step * (step - seen) / max(now - since, 1e-9)
                self._on_step(step, daemon.last_loss, tokens_per_s)
                seen, since = step, now

    # ------------------------------------------------------------------ the health record
    def record(self) -> HealthRecord:
        p = self._peer
        if p is None:
            raise RuntimeError("the monitor reports a peer only once its stage serves (attach() first).")
        d, t, runner = p.daemon, p.transport, p.daemon.runner
        now = time.monotonic()
        kind = KIND_BACKWARD if runner.is_last else KIND_FORWARD
        totals = _Totals(now, t.bytes_received(), t.bytes_sent(), d.sent_tokens[kind])
        last = self._last or _Totals(self.started, 0, 0, 0)
        dt = max(now - last.time, 1e-9)
        self._last = totals
        history = list(self._history)  # publish() drops these points once a record carrying them is stored
        device, memory = device_and_memory(p.device)
        banned = {peer: n for peer, n in list(p.router.banned_peers().items())[:MAX_BANNED] if 0 < len(peer) <= 128}
        return HealthRecord(
            peer_id=p.peer_id, run_hash=p.spec.run_hash, stage=d.stage,
            state=d.state if self.state == "online" else self.state, step=runner.step,
            tokens_per_s=max(0, totals.tokens - last.tokens) / dt, queue=int(d.status(self.state).queue),
            loss=_finite(d.last_loss) if (runner.is_first or runner.is_last) else None, loss_history=history,
            bytes_in_per_s=max(0, totals.bytes_in - last.bytes_in) / dt,
            bytes_out_per_s=max(0, totals.bytes_out - last.bytes_out) / dt,
            bytes_in=totals.bytes_in, bytes_out=totals.bytes_out,
            act_bytes_out=t.bytes_sent(KIND_FORWARD), act_tokens_out=d.sent_tokens[KIND_FORWARD],
            grad_bytes_out=t.bytes_sent(KIND_BACKWARD), grad_tokens_out=d.sent_tokens[KIND_BACKWARD],
            codec=p.spec.codec, rank=p.spec.boundary_width, basis_version=runner.basis_version,
            basis_updated_step=int(getattr(runner, "basis_updated_step", 0)), device=device, memory_bytes=memory,
            peak_memory_bytes=peak_memory(p.device),
            uptime_s=now - self.started, reachability=reachability_of(p.maddrs), version=__version__,
            refused=d.refused, banned=banned, sync_bytes_out=t.bytes_sent(KIND_REDUCE),
            sync_steps=p.commit.synced_steps if p.commit is not None else 0,
            checkpoint_error=self.checkpoint_error[:MAX_REASON],
            run_bans={peer: why[:MAX_REASON] for peer, why in list(p.router.run_bans_listed().items())[:MAX_BANNED]
                      if 0 < len(peer) <= 128},
        )

    async def publish(self, ttl: float) -> bool:
        """Sign and store this peer's record for `ttl` s; a failure is logged, never raised (the next beat retries)."""
        if self._peer is None:
            return False
        try:
            record = self.record()
            stored = await publish_health(self._peer.sdht, record, ttl)  # signed by the peer's libp2p identity
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a DHT hiccup must not end the heartbeat
            log.warning("could not publish this peer's health record (%s: %s)", type(e).__name__, e)
            return False
        if not stored:
            log.warning("the DHT did not store this peer's health record; the next heartbeat retries")
        else:
            for _ in range(min(len(record.loss_history), len(self._history))):
                self._history.popleft()  # sent; steps that came in meanwhile stay for the next beat
        self.published += int(stored)
        return stored

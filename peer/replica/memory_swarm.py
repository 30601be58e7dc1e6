"""A whole swarm of StagePeers in one process, over the loopback network: the peer tests'
swarm, and the replica-sync benchmark's (which shapes its links). Also the single-replica
in-process oracle the swarm is compared against, and a hash of a stage's parameters."""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field

import torch

from peer.daemon.loopback import LoopbackLink, LoopbackNetwork
from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from peer.runner.stage import StageRunner
from peer.step.driver import StepLog
from protocol.spec import RunSpec

from .stage_peer import StagePeer


def batches(spec: RunSpec, data: str | None = None):
    return BatchSource(load_corpus(data, seq_len=spec.seq_len), spec.seq_len, spec.microbatch_size,
                       spec.data_seed).microbatch


def oracle(spec: RunSpec, steps: int) -> list[float]:
    pipe = InProcessPipeline(spec)
    src = batches(spec)
    return [pipe.train_step(s, src).loss for s in range(steps)]


def param_hash(runner: StageRunner) -> str:
    h = hashlib.sha256()
    for p in runner.module.parameters():
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# short timeouts: a test's failures should cost seconds (a benchmark over slow links passes longer ones)
TEST_DRIVER_OPTIONS = dict(min_timeout=2.0, first_timeout=20.0, ping_period=0.2, watch_period=None)
TEST_COMMIT_OPTIONS = dict(reduce_timeout=5.0)


@dataclass
class MemorySwarm:
    spec: RunSpec
    net: LoopbackNetwork
    peers: dict[str, StagePeer] = field(default_factory=dict)
    logs: list[StepLog] = field(default_factory=list)
    device: str = "cpu"
    data: str | None = None  # the heads' corpus (None: the embedded one)
    driver_options: dict = field(default_factory=lambda: dict(TEST_DRIVER_OPTIONS))
    commit_options: dict = field(default_factory=lambda: dict(TEST_COMMIT_OPTIONS))
    snapshot_options: dict = field(default_factory=dict)  # SnapshotService's (every, copies, keep, ...)
    daemon_options: dict = field(default_factory=dict)  # StageDaemon's (deadline_floor, ...)

    def stage(self, s: int) -> list[StagePeer]:
        return [p for p in self.peers.values() if p.runner.stage == s and p.peer_id not in self.net.down]

    async def add(self, stage: int, name: str, link_cls=LoopbackLink, announce: str = "online") -> StagePeer:
        peer = StagePeer(StageRunner(self.spec, stage, self.device), link_cls(self.net, name),
                         self.net.directory(name), batches=batches(self.spec, self.data) if stage == 0 else None,
                         driver_options=self.driver_options, commit_options=self.commit_options,
                         snapshot_options=self.snapshot_options, daemon_options=self.daemon_options)
        await peer.start()
        await peer.announce(announce)
        self.peers[name] = peer
        return peer

    async def drive(self, steps: int, on_step=None) -> list[StepLog]:
        """Every head drives (the leader) or stands by until the swarm has done `steps` steps."""
        def record(log: StepLog) -> None:
            self.logs.append(log)
            if on_step is not None:
                on_step(log)
        self.tasks = {h.peer_id: asyncio.create_task(h.drive(steps, record)) for h in self.stage(0)}
        await asyncio.wait(self.tasks.values(), return_when=asyncio.ALL_COMPLETED)
        for name, t in self.tasks.items():
            if name not in self.net.down:
                t.result()  # raise what a live head raised
        return self.logs

    async def join_after(self, steps: int, stage: int, name: str, donor: str) -> tuple[StagePeer, int]:
        """Once the swarm has done `steps` steps, a fresh peer joins `stage` by downloading the state
        of `donor`; returns it and the number of steps done when it went online."""
        while len(self.logs) < steps:
            await asyncio.sleep(0.01)  # poll the run's progress
        newcomer = await self.add(stage, name, announce="syncing")
        await newcomer.join([donor])
        await newcomer.announce("online")
        return newcomer, len(self.logs)

    async def applied(self) -> None:
        """Wait until the leading head has told every replica to apply the last step (the driver
        applies a step itself first and tells the others in the background)."""
        await asyncio.gather(*(h.driver._applying for h in self.stage(0) if h.driver is not None
                               and h.driver._applying is not None), return_exceptions=True)

    def kill(self, name: str) -> None:
        """The peer vanishes at once (its head loop, if any, stops with it). A head's telling the others to apply
        its last step would still run here, every message of it failing now, and retry for `command_timeout`
        before its head loop could end: a dead head asks nobody again (as a dead process would not)."""
        self.net.kill(name)
        task = getattr(self, "tasks", {}).get(name)
        if task is not None:
            task.cancel()
        driver = getattr(self.peers.get(name), "driver", None)
        if driver is not None:
            driver._commands.command_timeout = 0.0  # read when its apply of the last step starts

    async def stop(self) -> None:
        for p in self.peers.values():
            await p.stop()


async def make_swarm(spec: RunSpec, replicas: list[int], link_cls=LoopbackLink, **options) -> MemorySwarm:
    """`replicas[s]` peers for stage s, named s{s}r{i}; `options`: MemorySwarm's fields (device, data, ...)."""
    swarm = MemorySwarm(spec, LoopbackNetwork(), **options)
    for s, n in enumerate(replicas):
        for r in range(n):
            await swarm.add(s, f"s{s}r{r}", link_cls)
    return swarm

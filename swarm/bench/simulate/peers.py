"""The simulated swarm: peers, the directory they announce in, their links, and churn.

Each `SimPeer` has a GPU (a `Worker` running its jobs in order at its sustained rate), a home link
(the project's `HomeLink` on the virtual clock) and the project's own `Router`
(swarm/replicas/router.py, unchanged) over `SimDHT`, an in-memory stand-in for `SwarmDHT` that
holds every peer's `StageAnnouncement`. A live peer's record is always fresh; a dead peer's
record lives on for `ttl` after its last heartbeat (drawn uniformly in the heartbeat period,
ttl/3, before its death), as a DHT record of a killed process does, so routers still pick it
until a send to it fails (`send`: a dead receiver costs the sender `dial_fail_s` plus a round
trip, and the router bans it).

Placement is the project's own: the first peers take `placement.emptiest` of the directory one
after another (a swarm that grew one peer at a time); a replacement runs `placement.choose_stage`
(its announcements, jittered looks and the pile-up rule, on the virtual clock), then downloads
the stage's state from a live replica (its uplink, shared with that replica's work; the donor
is the one `ReplicaService` asks first: the highest announced throughput, i.e. the leading
head at stage 0) as `download_state` does, chunk by chunk (a request, then a chunk of at most
8 MiB over the donor's uplink: the donor's own frames go between them), while the donor forwards
it every step the swarm applies from the snapshot's on (`follow` bytes each, over the same
uplink, peer/commit/follow_forward.py). It is online once it holds the state and every forwarded step;
one that falls more than 64 steps behind (the follower's queue, `MAX_QUEUED`) downloads again.
A stage left without any replica is restored from a snapshot held by a peer of another stage, and
the swarm rolls back to the last snapshot step (`snapshot_every`).

Churn: every peer lives an exponential time of mean `lifetime_s` (inf: no churn); when it dies
a replacement with a freshly drawn GPU and link joins `rejoin_s` later, so the swarm keeps N peers
on average.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from peer.daemon.interfaces import PeerStatus
from peer.state.state_transfer import MAX_QUEUED
from protocol.spec import RunSpec
from protocol.state_wire import STATE_CHUNK_BYTES
from swarm.dht import StageAnnouncement
from swarm.net import HomeLink
from swarm.replicas import placement
from swarm.replicas.router import Router

from .engine import SendLine, SharedCores, Worker, now
from .hardware import LinkDraw, StageWork, exponential_lifetime


@dataclass
class _Admission:
    swarm_key: str = ""  # no coordinator's key: the router's lease rule is off (leader: first head to join)

    @property
    def policy(self) -> _Admission:
        return self


@dataclass
class SimDHT:
    """The announcements of every peer, read as `SwarmDHT.stage_peers` reads them (module docstring).
    A live peer's record is re-stamped when read once a heartbeat period (ttl/3) has passed."""

    ttl: float
    stages: dict[int, dict[str, StageAnnouncement]] = field(default_factory=dict)
    alive: dict[str, bool] = field(default_factory=dict)
    expires: dict[str, float] = field(default_factory=dict)  # dead peer -> when its record expires
    admission: _Admission = field(default_factory=_Admission)

    async def stage_peers(self, run_hash: str, stage: int) -> list[StageAnnouncement]:
        t, out = now(), []
        records = self.stages.get(stage, {})
        for p, a in list(records.items()):
            if self.alive.get(p):
                if a.timestamp < t - self.ttl / 3:  # its heartbeat
                    a = records[p] = dataclasses.replace(a, timestamp=t)
            elif self.expires[p] <= t:
                del records[p]
                continue
            out.append(a)
        return out

    async def announce(self, ann: StageAnnouncement, ttl: float) -> bool:
        for records in self.stages.values():
            records.pop(ann.peer_id, None)
        self.stages.setdefault(ann.stage, {})[ann.peer_id] = dataclasses.replace(ann, timestamp=now())
        return True

    async def fetch_lease(self, run_hash: str):
        return None

    def died(self, peer: str, last_beat: float) -> None:
        self.alive[peer] = False
        for records in self.stages.values():
            if peer in records:
                records[peer] = dataclasses.replace(records[peer], timestamp=last_beat)
        self.expires[peer] = last_beat + self.ttl


@dataclass(eq=False)
class SimPeer:
    peer_id: str
    gpu: str
    rate: float  # sustained FLOP/s (or 1.0 with measured seconds)
    link: HomeLink
    latency_s: float
    router: Router
    joined: float
    stage: int = -1
    alive: bool = True
    ready: bool = False  # it holds the stage's state and announced itself online
    worker: Worker = field(default_factory=Worker)
    line: SendLine = field(default_factory=SendLine)  # its activations and gradients, in order on its uplink
    microbatches: int = 0  # done this step (stage work of one microbatch counts one)
    donor: SimPeer | None = None  # while it catches up: the replica that forwards it the steps
    snapshot: int = 0  # the step its downloaded state is at
    forwarded: int = 0  # steps forwarded to it that arrived


@dataclass
class SwarmConfig:
    spec: RunSpec
    work: StageWork
    gpus: list[tuple[str, float]]  # (name, sustained FLOP/s) a peer's GPU is drawn from, uniformly
    links: LinkDraw
    state_bytes: tuple[int, ...]
    lifetime_s: float = math.inf
    follow_bytes: tuple[int, ...] = ()  # per stage: one forwarded step (WireBytes.follow); () forwards nothing
    follow_alone_bytes: tuple[int, ...] = ()  # the same from a donor alone in its reduce
    rejoin_s: float = 60.0
    ttl: float = 20.0
    dial_fail_s: float = 1.0
    snapshot_every: int = 50
    seed: int = 0
    cores: SharedCores | None = None  # every peer on one machine's cores (validation), else one GPU each
    frame_s: float = 0.0  # the transport's own delay per frame (p2pd, framing, asyncio), measured when validating
    send_order: str = "fifo"  # `swarm peer --send-order`: "fifo" (activations and gradients in turn) or "shared"
    request_bytes: int = 200  # a state request (a chunk's index) with its framing


class SimSwarm:
    """Peers, their directory and churn (module docstring); `step.py` drives the steps."""

    def __init__(self, cfg: SwarmConfig) -> None:
        self.cfg, self.spec = cfg, cfg.spec
        self.rng = random.Random(cfg.seed)
        self.dht = SimDHT(cfg.ttl)
        self.peers: dict[str, SimPeer] = {}
        self.order: list[str] = []  # heads by when they joined: the leader lease's order
        self.on_death: Callable[[SimPeer], None] = lambda p: None
        self.counter = 0
        self.restores = 0  # stages restored from a snapshot (the swarm rolled back)
        self.rollback_to: int | None = None  # set when a restore needs the swarm to go back to a snapshot step
        self.deaths = 0
        self.errors: list[BaseException] = []
        self.leader_id: str | None = None  # the driver's leading head
        self.applied = 0  # steps the swarm has applied (the driver's step)
        self.downloads = 0  # state downloads started (a replacement that fell behind starts another)
        self.online = 0  # replacements that came online (held the state and every forwarded step)

    # ------------------------------------------------------------------ peers
    def _new_peer(self) -> SimPeer:
        self.counter += 1
        pid = f"sim{self.counter:05d}"
        name, rate = self.rng.choice(self.cfg.gpus)
        up, lat = self.cfg.links.draw(self.rng)
        loop = asyncio.get_running_loop()
        router = Router(self.dht, self.spec.run_hash, pid, [], ttl=self.cfg.ttl, clock=loop.time)
        peer = SimPeer(pid, name, rate, self.cfg.links.link(up, lat, loop.time), lat, router, now(),
                       worker=Worker(self.cfg.cores))
        self.peers[pid] = peer
        self.dht.alive[pid] = True
        return peer

    async def _announce(self, peer: SimPeer, state: str) -> None:
        await peer.router.announce(PeerStatus(peer.stage, state))

    async def populate(self, n: int) -> None:
        """The first `n` peers, placed one after another on the emptiest stage (placement.emptiest)."""
        for _ in range(n):
            peer = self._new_peer()
            peers = await placement.directory(peer.router, self.spec.n_stages, now=now)
            peer.stage = placement.emptiest(peers)
            peer.ready = True
            await self._announce(peer, "online")
            if peer.stage == 0:
                self.order.append(peer.peer_id)
            self._schedule_death(peer)

    def live(self, stage: int) -> list[SimPeer]:
        return [p for p in self.peers.values() if p.alive and p.ready and p.stage == stage]

    # ------------------------------------------------------------------ links
    async def send(self, src: SimPeer, dst: SimPeer, nbytes: int, ordered: bool = False) -> bool:
        """A frame from `src` to `dst`: False if `dst` was dead (the sender learns it after a failed
        dial) or died before it arrived. `ordered`: an activation or a gradient, which waits its turn in
        `src`'s send line when the swarm sends in order (`send_order` "fifo", the swarm's default)."""
        if not dst.alive:
            await asyncio.sleep(self.cfg.dial_fail_s + 2 * src.latency_s)
            return False
        if ordered and self.cfg.send_order == "fifo":
            await src.line.send(src.link, nbytes)
        else:
            await src.link.send(nbytes)
        if not dst.alive:
            return False
        await dst.link.receive(nbytes)
        if self.cfg.frame_s:
            await asyncio.sleep(self.cfg.frame_s)
        return dst.alive and src.alive

    async def _download(self, donor: SimPeer, peer: SimPeer) -> bool:
        """The stage's state from `donor`, chunk by chunk as `download_state` asks for it."""
        self.downloads += 1
        left = self.cfg.state_bytes[peer.stage]
        while left > 0:
            if not await self.send(peer, donor, self.cfg.request_bytes):
                return False
            chunk = min(left, STATE_CHUNK_BYTES)
            if not await self.send(donor, peer, chunk):
                return False
            left -= chunk
        return True

    async def _catch_up(self, donor: SimPeer, peer: SimPeer) -> bool:
        """Download from a live replica, then wait for every step it forwards until this one is level; False if
        either died or this one fell more than `MAX_QUEUED` steps behind (it downloads again)."""
        if not self.cfg.follow_bytes:
            return await self._download(donor, peer)
        peer.donor, peer.snapshot, peer.forwarded = donor, self.applied, 0
        try:
            if not await self._download(donor, peer):
                return False
            while peer.alive and donor.alive:
                behind = self.applied - peer.snapshot - peer.forwarded
                if behind == 0:
                    return True
                if behind > MAX_QUEUED:
                    return False
                await asyncio.sleep(0.1)  # the forwarded steps are on their way over the donor's uplink
            return False
        finally:
            peer.donor = None

    def stepped(self, step: int) -> None:
        """The driver applied `step` steps: each donor forwards the step to the replicas catching up from it."""
        rolled_back = step <= self.applied
        self.applied = step
        for peer in [p for p in self.peers.values() if p.alive and p.donor is not None]:
            if rolled_back:  # every stage went back to a snapshot: so does a joiner's download
                peer.snapshot, peer.forwarded = step, 0
                continue
            alone = len(self.live(peer.stage)) <= 1
            nbytes = (self.cfg.follow_alone_bytes if alone else self.cfg.follow_bytes)[peer.stage]
            asyncio.get_running_loop().create_task(self._forward(peer.donor, peer, nbytes))

    async def _forward(self, donor: SimPeer, peer: SimPeer, nbytes: int) -> None:
        if await self.send(donor, peer, nbytes) and peer.donor is donor:
            peer.forwarded += 1

    # ------------------------------------------------------------------ churn
    def _schedule_death(self, peer: SimPeer) -> None:
        life = exponential_lifetime(self.rng, self.cfg.lifetime_s)
        if not math.isinf(life):
            asyncio.get_running_loop().call_later(life, self._die, peer)

    def _die(self, peer: SimPeer) -> None:
        peer.alive = False
        self.deaths += 1
        self.dht.died(peer.peer_id, now() - self.rng.uniform(0.0, self.cfg.ttl / 3))
        if peer.peer_id in self.order:
            self.order.remove(peer.peer_id)
        self.on_death(peer)
        asyncio.get_running_loop().call_later(self.cfg.rejoin_s, self._spawn_join)

    def _spawn_join(self) -> None:
        task = asyncio.get_running_loop().create_task(self.join())
        task.add_done_callback(self._check)

    def _check(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())  # the driver raises it: a bug in the model, not churn

    async def join(self) -> SimPeer:
        """A replacement: the real `choose_stage`, then a state download, then online."""
        peer = self._new_peer()
        async def answers(pid: str) -> bool:
            return self.dht.alive.get(pid, False)
        peer.stage = await placement.choose_stage(peer.router, self.spec, "auto", self.rng, now=now, answers=answers)
        await self._announce(peer, "syncing")
        while peer.alive:
            donors = self.live(peer.stage)
            if donors:
                # replica.py's order: the highest announced throughput first (the leading head at stage 0, the
                # replica that passed on the most microbatches elsewhere), then the peer id
                donor = min(donors, key=lambda p: (p.peer_id != self.leader_id, -p.microbatches, p.peer_id))
                ok = await self._catch_up(donor, peer)
            else:  # nobody holds the stage: a custodian of another stage has its snapshot
                custodians = [p for s in range(self.spec.n_stages) if s != peer.stage for p in self.live(s)]
                if not custodians:
                    await asyncio.sleep(5.0)  # asks again every 5 s (design.md, snapshots)
                    continue
                ok = await self._download(self.rng.choice(custodians), peer)
                if ok and not self.live(peer.stage):
                    self.restores += 1
                    self.rollback_to = -1  # the driver rolls back to its last snapshot step
            if ok:
                break
        if not peer.alive:
            return peer
        peer.ready = True
        self.online += 1
        if peer.stage == 0:
            self.order.append(peer.peer_id)
        await self._announce(peer, "online")
        self._schedule_death(peer)
        return peer

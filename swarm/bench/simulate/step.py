"""The simulated step: what the leading head's `StepDriver` (peer/step/driver.py) and every stage's
`StageDaemon` and `StepCommit` do with one step, on the simulated swarm.

One attempt at a step:

1. the leader is `leadership.leader_of` the live heads in the order they joined (the lease's
   order); when it dies, the next one takes over after `takeover_s` (three missed pings) plus a
   status and an abort round trip; with no live head, or a stage without a live replica, the
   swarm pauses and looks again every 0.5 s (`_wait_for_coverage`);
2. microbatches: by default (the schedule before issue 22 item 1) only the leader computes stage 0
   (`StepDriver._run_microbatches` then): it
   queues the forward of every microbatch on its GPU (at most `RunSpec.microbatches_in_flight` of
   them between forward and gradient when the spec bounds it), and sends each on as it is done. With
   `every_head_works` (issue 22 item 1, modelled before it was built; the swarm now runs it,
   peer/commit/head_work.py, splitting by measured speed) the leader splits the M microbatches over every
   live head in proportion to its sustained FLOP/s (largest remainders), telling each with a command.
   Every hop picks the next stage's replica with the
   sender's own `Router.pick` (least (in flight + 1) x measured round trip, probation, bans),
   the receiver queues the forward (the tail: forward and backward) on its GPU, the gradient goes
   back to exactly the sender, which queues its backward, and `Router.release` records the round
   trip; each activation and gradient waits its turn in its sender's send line (`SendLine`, the
   swarm's `--send-order fifo`). A send to a dead replica fails; the sender bans it (`report_failure`) and picks again;
3. commit: the leader seats each stage's reduce as the driver does (`ReduceSeats`, peer/step/seats.py: every
   member, or where some may be left out, after a status round trip, the members holding work, the
   proven and `probation_seats` drawn; `probation_seats=None`: every member, the rule before it) and sends
   "reduce" to them; each stage's seated replicas send their contribution to every other one (exact: one
   round; powersgd: two, the second after the first's sums), answer, and the leader sends "apply" and goes on;
4. a death of a peer that holds work of the attempt, or did the last step's work (what
   `AttemptWatch` pings), fails the attempt `watch_s` later (three pings at 1 s); in the commit,
   a member that died fails it `reduce_dead_s` later (`ReduceWatch`); the attempt also fails at
   the driver's timeout (max(15 s, 4 x the EWMA of the microbatch phase); 120 s at first). A
   failed attempt is re-driven after min(attempts, 10) x 0.2 s, as the driver does.

Not modelled: the per-microbatch deadlines of `StageDaemon._forward` (a slow replica is
waited for), the optimizer step on a GPU,
encode/decode and the reduce's arithmetic (small next to the blocks), basis updates, rebalancing
(`Rebalancer`) and memory fit.
"""
from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field

from peer.daemon.interfaces import LinkError, PeerInfo
from peer.step.leadership import leader_of
from peer.step.seats import PROBATION_SEATS, ReduceSeats
from protocol.control import CommandReply

from .engine import now
from .hardware import WireBytes
from .peers import SimPeer, SimSwarm


class AttemptFailed(Exception):
    pass


@dataclass
class StepOptions:
    microbatches: int
    every_head_works: bool = False
    watch_s: float = 3.0
    reduce_dead_s: float = 5.0
    takeover_s: float = 3.0
    min_timeout: float = 15.0
    first_timeout: float | None = 120.0  # swarm peer --step-timeout (None: the operator set it high enough)
    reduce: str = "all"  # REDUCES: "all", as the swarm does; "ring", a reduce not built yet (modelled)
    probation_seats: int | None = PROBATION_SEATS  # None: every member sits in the reduce (the rule before seats)


# how a stage's replicas exchange a reduce round of b bytes each: "all" sends every other replica the whole
# contribution ((n - 1) b a replica, design.md 7); "ring" is a ring all-reduce (reduce-scatter, then
# all-gather: 2 (n - 1) hops of b / n, each after the last hop's chunk arrived, so 2 (n - 1) / n b a replica
# and 2 (n - 1) one-way latencies in a row)
REDUCES = ("all", "ring")


@dataclass
class StepRecord:
    step: int
    end: float
    attempts: int
    microbatch_s: float  # the last attempt's microbatch phase
    commit_s: float  # its reduce


@dataclass
class StepDriverModel:
    swarm: SimSwarm
    opts: StepOptions
    wire: WireBytes
    records: list[StepRecord] = field(default_factory=list)
    step: int = 0
    last_snapshot: int = 0
    rollbacks: int = 0
    lost_steps: int = 0
    failed_attempts: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # the first words of each failure's reason -> count
    _leader: SimPeer | None = None
    _failed: asyncio.Future | None = None
    _involved: set[str] = field(default_factory=set)
    _workers: set[str] = field(default_factory=set)
    _phase_ewma: float | None = None
    _in_commit: bool = False
    _phases: tuple[float, float] = (0.0, 0.0)
    _seats: ReduceSeats | None = None  # the leader's memory of who works (a new leader starts without one)

    def __post_init__(self) -> None:
        self.swarm.on_death = self._on_death
        self.spec = self.swarm.spec

    # ------------------------------------------------------------------ failures
    def _fail(self, why: str) -> None:
        if self._failed is not None and not self._failed.done():
            self._failed.set_exception(AttemptFailed(why))

    def _on_death(self, peer: SimPeer) -> None:
        if peer.peer_id in self._involved or peer is self._leader:
            delay = (self.opts.takeover_s if peer is self._leader
                     else self.opts.reduce_dead_s if self._in_commit else self.opts.watch_s)
            failed = self._failed
            asyncio.get_running_loop().call_later(delay, lambda: failed is self._failed and self._fail(
                f"peer {peer.peer_id} died holding work"))

    async def _never(self) -> None:
        await asyncio.get_running_loop().create_future()  # cancelled when the attempt ends

    # ------------------------------------------------------------------ the loop
    async def run(self, steps: int | None = None, seconds: float | None = None) -> None:
        """Drive steps until `steps` are committed or the virtual clock passes `seconds`."""
        attempts = 0
        while (steps is None or self.step < steps) and (seconds is None or now() < seconds):
            if self.swarm.errors:
                raise self.swarm.errors[0]
            leader = await self._lead()
            if leader is None or not await self._covered():
                await asyncio.sleep(0.5)  # paused: the driver polls the directory
                continue
            if self.swarm.rollback_to is not None:  # a stage came back from a snapshot: every stage rolls back
                self.swarm.rollback_to = None
                self.rollbacks += 1
                self.lost_steps += self.step - self.last_snapshot
                self.step = self.last_snapshot
                self.swarm.stepped(self.step)
            attempts += 1
            try:
                await self._attempt(leader)
            except AttemptFailed as e:
                self.failed_attempts += 1
                why = re.sub(r"sim\d+", "X", str(e))  # per kind of failure, not per peer
                self.failures[why] = self.failures.get(why, 0) + 1
                await asyncio.sleep(min(attempts, 10) * 0.2)
                continue
            self.step += 1
            self.swarm.stepped(self.step)
            if self.step % self.swarm.cfg.snapshot_every == 0:
                self.last_snapshot = self.step
            self.records.append(StepRecord(self.step, now(), attempts, *self._phases))
            attempts = 0

    async def _lead(self) -> SimPeer | None:
        heads = [PeerInfo(p.peer_id, 0, "online", 0, 0.0) for p in self.swarm.live(0)]
        pid = leader_of(heads, self.swarm.order)
        leader = self.swarm.peers[pid] if pid is not None else None
        if leader is not None and self._leader is not None and leader is not self._leader:
            # a new leader: a status and an abort round trip to every peer before its first attempt
            await asyncio.sleep(2 * 2 * max(p.latency_s for p in self.swarm.peers.values() if p.alive))
        if leader is not self._leader and leader is not None and self.opts.probation_seats is not None:
            self._seats = ReduceSeats(leader.peer_id, probation=self.opts.probation_seats)
        self._leader = leader
        self.swarm.leader_id = pid
        return leader

    async def _covered(self) -> bool:
        return all(self.swarm.live(s) for s in range(self.spec.n_stages))

    def _timeout(self) -> float | None:
        if self._phase_ewma is None:
            return self.opts.first_timeout
        return max(self.opts.min_timeout, 4.0 * self._phase_ewma)

    # ------------------------------------------------------------------ one attempt
    async def _attempt(self, leader: SimPeer) -> None:
        self._failed = asyncio.get_running_loop().create_future()
        self._failed.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._involved = set(self._workers) | {leader.peer_id}
        for p in self.swarm.peers.values():
            p.microbatches = 0
        t0 = now()
        heads = self.swarm.live(0) if self.opts.every_head_works else [leader]
        shares = _shares(self.opts.microbatches, heads)
        tasks = [asyncio.ensure_future(self._head(leader, head, n)) for head, n in shares if n]
        try:
            await self._until_failed(asyncio.gather(*tasks), self._timeout())
            seconds = now() - t0
            self._phase_ewma = seconds if self._phase_ewma is None else 0.8 * self._phase_ewma + 0.2 * seconds
            self._in_commit, t1 = True, now()
            await self._until_failed(self._commit(leader), None)
            self._phases = (seconds, now() - t1)
        finally:
            self._in_commit = False
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._workers = {p.peer_id for p in self.swarm.peers.values() if p.microbatches and p.alive}
        if self._seats is not None:
            self._seats.remember(self.step + 1, {0: sorted(self._workers)})

    async def _until_failed(self, work, timeout: float | None) -> None:
        work = asyncio.ensure_future(work)
        try:
            done, _ = await asyncio.wait({work, self._failed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        if self._failed in done:
            raise self._failed.exception()
        if work not in done:
            raise AttemptFailed("not every gradient came back within the driver's timeout")
        work.result()

    async def _head(self, leader: SimPeer, head: SimPeer, n: int) -> None:
        if head is not leader:  # the leader's command naming this head's microbatches
            self._involved.add(head.peer_id)
            if not await self.swarm.send(leader, head, self.wire.command):
                await self._never()
        # at most `microbatches_in_flight` between forward and gradient (peer/commit/head_work.py start_in_window)
        slots = asyncio.Semaphore(self.spec.microbatches_in_flight or n)

        async def in_window() -> None:
            async with slots:
                await self._microbatch(head)
        await _all(in_window() for _ in range(n))

    async def _microbatch(self, head: SimPeer) -> None:
        fwd, bwd = self.swarm.cfg.work.seconds(0, head.rate)
        head.microbatches += 1
        await head.worker.run(fwd)
        self._forwarded()
        await self._hop(0, head)
        await head.worker.run(bwd)

    def _forwarded(self) -> None:
        """A head's worker finished a microbatch's forward (a hook: the overlapped schedule counts them)."""

    async def _hop(self, s: int, peer: SimPeer) -> None:
        """`peer` of stage s has a microbatch's activation: send it on, and return once its gradient is back."""
        last = self.spec.n_stages - 1
        while True:
            try:
                nid = await peer.router.pick(s + 1)
            except LinkError as e:
                self._fail(str(e))
                await self._never()
            nxt, t0 = self.swarm.peers[nid], now()
            try:
                if not await self.swarm.send(peer, nxt, self.wire.activation, ordered=True):
                    if not peer.alive:
                        await self._never()
                    peer.router.report_failure(nid)
                    continue
                self._involved.add(nid)
                nxt.microbatches += 1
                fwd, bwd = self.swarm.cfg.work.seconds(s + 1, nxt.rate)
                if s + 1 == last:
                    await nxt.worker.run(fwd + bwd)
                else:
                    await nxt.worker.run(fwd)
                    await self._hop(s + 1, nxt)
                    await nxt.worker.run(bwd)
                if not nxt.alive or not await self.swarm.send(nxt, peer, self.wire.gradient, ordered=True):
                    await self._never()  # the microbatch is lost: the watch fails the attempt
                peer.router.release(nid, now() - t0)
                nid = None
                return
            finally:
                if nid is not None:  # failed, or the attempt ended: the daemon forgets what it had in flight
                    peer.router.release(nid, None)

    # ------------------------------------------------------------------ commit
    async def _commit(self, leader: SimPeer) -> None:
        ready: dict[int, list[SimPeer]] = {}
        for s in range(self.spec.n_stages):
            found = [self.swarm.peers[m.peer_id] for m in await leader.router.members(s)]
            ready[s] = [p for p in found if p.ready]
        groups = await self._seated(leader, ready)
        self._involved |= {p.peer_id for g in groups.values() for p in g}
        await _all(self._reduce(leader, s, g) for s, g in groups.items())
        apply = self.swarm.cfg.work.apply
        if apply is not None:
            await leader.worker.run(apply[0])
        for s, g in groups.items():  # "apply": the leader goes on while the others are told
            for p in g:
                if p is not leader:
                    asyncio.ensure_future(self._apply(leader, p, apply[s] if apply is not None else 0.0))

    async def _seated(self, leader: SimPeer, ready: dict[int, list[SimPeer]]) -> dict[int, list[SimPeer]]:
        """Each stage's seats in the reduce, by the driver's own `ReduceSeats.seat` (its status round trip a send
        to each member of a crowded stage); a stage with no ready peer reduces at the leader, as before."""
        seats = None
        if self._seats is not None:
            async def status(pid: str, step: int, attempt: int) -> CommandReply:
                p = self.swarm.peers[pid]
                ok = await self.swarm.send(leader, p, self.wire.command)
                return CommandReply(step, attempt, "ok" if ok else "failed", [0] if p.microbatches else [])
            seating = await self._seats.seat({p.peer_id: s for s, g in ready.items() for p in g}, self.step, 0,
                                             status, self.swarm.order, b"")
            seats = {p for g in seating.groups.values() for p in g}
        return {s: [p for p in g if seats is None or p.peer_id in seats] or [leader] for s, g in ready.items()}

    async def _apply(self, leader: SimPeer, peer: SimPeer, seconds: float) -> None:
        if await self.swarm.send(leader, peer, self.wire.command):
            await peer.worker.run(seconds)

    async def _reduce(self, leader: SimPeer, stage: int, group: list[SimPeer]) -> None:
        n = len(group)
        rounds = self.wire.sync_rounds[stage] if n > 1 else ()
        ring = self.opts.reduce == "ring" and n > 2
        loop = asyncio.get_running_loop()
        # all-to-all: who has sent each round; ring: who has each hop's chunk in, per round
        sent = [] if ring else [[loop.create_future() for _ in group] for _ in rounds]
        hops = [[[loop.create_future() for _ in group] for _ in range(2 * (n - 1))] for _ in rounds] if ring else []

        async def replica(i: int, p: SimPeer) -> None:
            if p is not leader and not await self.swarm.send(leader, p, self.wire.command):
                leader.router.report_failure(p.peer_id)  # unreachable: left out of the next attempt's reduce
                await asyncio.sleep(self.opts.reduce_dead_s)  # its partners give up on it
                raise AttemptFailed(f"replica {p.peer_id} of stage {stage} did not reduce")
            for k, b in enumerate(rounds):
                if ring:
                    nxt, chunk = group[(i + 1) % n], -(-b // n)
                    for t, arrived in enumerate(hops[k]):
                        if t:
                            await hops[k][t - 1][i]  # the chunk this hop forwards (summed, then whole) is in
                        await p.link.send(chunk)
                        await nxt.link.receive(chunk)
                        arrived[(i + 1) % n].set_result(None)
                    continue
                await p.link.send((n - 1) * b)  # one contribution to each other replica, sharing the uplink
                sent[k][i].set_result(None)
                await asyncio.gather(*sent[k])
                await p.link.receive((n - 1) * b)
            if p is not leader and not await self.swarm.send(p, leader, self.wire.command):
                await self._never()

        await _all(replica(i, p) for i, p in enumerate(group))


async def _all(coros) -> None:
    """Run the coroutines together; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _shares(m: int, heads: list[SimPeer]) -> list[tuple[SimPeer, int]]:
    """m microbatches over `heads` in proportion to their rates, by largest remainders."""
    total = sum(h.rate for h in heads)
    exact = [m * h.rate / total for h in heads]
    counts = [math.floor(x) for x in exact]
    for i in sorted(range(len(heads)), key=lambda i: counts[i] - exact[i])[: m - sum(counts)]:
        counts[i] += 1
    return list(zip(heads, counts))

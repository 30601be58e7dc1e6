"""Every head works (issue 22, item 1): the leader splits a step's microbatches over the live heads.

The leading head (`peer/step/driver.py`) assigns each attempt's microbatches to itself and to every
other live head it sees that has answered it (`HeadWork.proven`: its status at the leader's
take-over, or its reduce of the last step the leader committed), weighted by their speeds
(`split_microbatches`), and tells each other head its share with a "work" command
(protocol/control.py). A head regenerates its microbatches
from (seed, step, index) (`peer/data/batches.py`), forwards them through its own stage-0 state, sends the
activations on through its own router, runs backward as the gradients come back (accumulating,
as the leader does for its own) and replies with each microbatch's loss once all are back. Stage
0's reduce then sums real contributions, each head's covering exactly its share, and the step
equals the one-process run (summation order aside). A head that fails its share fails the
attempt; the attempt is re-driven without it (it sits out `SIT_OUT_S`).

Stage 1 takes activations only from the heads the leader named for the step and attempt in
progress: before any other head is told its share, the leader sends every stage-1 replica the
same "work" command with the named heads (itself first) and no microbatches (`StageDaemon.feeders`).
A named head other than the leader may send only for that attempt (it cannot start a newer one);
an unnamed head not at all (`peer/daemon/inbound.py`; over the network `swarm/replicas/membership.py`).

A head's speed is microbatches per second of its last shares (an EWMA of its share's size over
the time from the leader's start to its last gradient, or to its reply), and until measured, the
compute speed a standby head announces (`peer/step/calibration.py`) over a microbatch's tokens. A
head's first share is not a measurement: it carries one-off costs (the accelerator's first kernels
and allocations, first connections) that make a head look many times slower than it is; on 4 H200s
(`large`, 2 stages x 2 heads) runs came out at the rate of one stage-0 GPU (1.8x one process, where
an even split gave 2.9-3.0x) until it was left out (docs/benchmarks.md).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import torch

from peer.daemon.daemon import StageDaemon
from peer.daemon.interfaces import LinkError, PeerDirectory, PeerInfo
from peer.daemon.step_log import AttemptFailed
from protocol.control import Command, CommandReply

log = logging.getLogger(__name__)

SIT_OUT_S = 30.0  # a head that failed its share gets none for this long (it still reduces, empty)
SPEED_DECAY = 0.5  # EWMA weight of a head's old speed
Send = Callable[..., Awaitable[CommandReply]]  # (peer, command[, timeout])


def split_microbatches(n: int, speeds: dict[str, float]) -> dict[str, list[int]]:
    """Microbatches 0..n-1 over the heads, in contiguous runs in peer-id order:

        share_h = 1 + floor(r x s_h / S) (+1 for the largest remainders, ties by peer id)

    with r = n - heads and S the sum of the speeds s_h: every head gets at least one microbatch
    (so that its speed stays measured), the rest goes by speed. With fewer microbatches than
    heads the fastest n heads get one each. Deterministic given the speeds."""
    heads = sorted(speeds)
    if n < len(heads):
        heads = sorted(sorted(heads, key=lambda h: (-speeds[h], h))[:n])
    if not heads:
        return {}
    total = sum(max(speeds[h], 0.0) for h in heads)
    rest = n - len(heads)
    quota = {h: rest * (max(speeds[h], 0.0) / total if total > 0 else 1 / len(heads)) for h in heads}
    count = {h: 1 + int(quota[h]) for h in heads}
    for h in sorted(heads, key=lambda h: (-(quota[h] - int(quota[h])), h))[:n - sum(count.values())]:
        count[h] += 1
    out, start = {}, 0
    for h in heads:
        out[h], start = list(range(start, start + count[h])), start + count[h]
    return out


async def first_failure(*aws: Awaitable) -> list:
    """The results of `aws`, or the first exception among them once it happens (the rest cancelled)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()
        return [t.result() for t in tasks]
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class HeadWork:
    """The leader's split of a step over the heads, and a head's side of a share it is given."""

    def __init__(self, daemon: StageDaemon, directory: PeerDirectory, batches: Callable[[int, int], torch.Tensor],
                 send: Send, timeout: float, own_figure: Callable[[], float | None]) -> None:
        self.daemon, self.directory, self.batches, self.send, self.timeout = daemon, directory, batches, send, timeout
        self.spec, self.peer_id = daemon.spec, daemon.peer_id
        self.own_figure = own_figure  # this head's calibrated compute speed (tokens/s), if it measured one
        self.speeds: dict[str, float] = {}  # head -> microbatches/s of its last shares (EWMA)
        self._warm: set[str] = set()  # heads whose first share (its one-off costs, not a speed) is done
        self.sitting_out: dict[str, float] = {}  # head -> time.monotonic() until which it gets no share
        self.shares: dict[str, list[int]] = {}  # the attempt in progress: head -> its microbatches
        # heads that answered this leader's status at its take-over or reduced in the last step it committed:
        # only those get a share, so a head that announces itself and then answers nothing costs no retry
        self.proven: set[str] = set()

    # ------------------------------------------------------------------ the leader
    def assign(self, heads: list[PeerInfo]) -> dict[str, list[int]]:
        """This attempt's shares over this head and the other live, proven heads that are not sitting out."""
        now, per_mb = time.monotonic(), self.spec.microbatch_size * self.spec.seq_len
        figures = {h.peer_id: h.throughput / per_mb for h in heads if h.peer_id != self.peer_id and h.state == "online"
                   and h.peer_id in self.proven and self.sitting_out.get(h.peer_id, 0.0) <= now}
        own = self.own_figure()
        figures[self.peer_id] = own / per_mb if own else 0.0
        known = list(self.speeds.values()) or [v for v in figures.values() if v > 0]
        fallback = sum(known) / len(known) if known else 1.0
        speeds = {h: self.speeds.get(h) or figures[h] or fallback for h in figures}
        self.shares = split_microbatches(self.spec.n_microbatches, speeds)
        return self.shares

    def _measured(self, head: str, n: int, seconds: float) -> None:
        if head not in self._warm:
            self._warm.add(head)
            return
        speed = n / max(seconds, 1e-6)
        old = self.speeds.get(head)
        self.speeds[head] = speed if old is None else SPEED_DECAY * old + (1 - SPEED_DECAY) * speed

    async def run(self, step: int, attempt: int, fed: list[torch.Tensor]) -> list[float]:
        """Split the attempt (`shares`), compute this head's share and have the others compute theirs;
        every microbatch's loss, in order. AttemptFailed names a head that failed its share (it sits out)."""
        self.assign(await self.directory.members(0))
        stage1 = [p.peer_id for p in await self.directory.members(1)] if self.spec.n_stages > 1 else []
        named, t0 = [self.peer_id] + sorted(h for h in self.shares if h != self.peer_id), time.monotonic()
        mine = self.shares.get(self.peer_id, [])

        async def own() -> dict[int, float]:
            futures = await start_in_window(self.daemon, step, mine, fed.__getitem__)
            losses = await asyncio.gather(*futures)
            if mine:
                self._measured(self.peer_id, len(mine), time.monotonic() - t0)
            return dict(zip(mine, losses))

        async def remote(head: str, mbs: list[int]) -> dict[int, float]:
            reply = await self.send(head, Command(self.spec.run_hash, step, attempt, "work", named, microbatches=mbs),
                                    self.timeout)
            if reply.outcome != "ok" or len(reply.losses) != len(mbs):
                self.sitting_out[head] = time.monotonic() + SIT_OUT_S
                raise AttemptFailed(f"head {head[-8:]} did not compute its share ({reply.reason or reply.outcome})",
                                    head)
            self._measured(head, len(mbs), time.monotonic() - t0)
            return dict(zip(mbs, reply.losses))

        async def others() -> list[dict[int, float]]:
            shares = {h: m for h, m in self.shares.items() if h != self.peer_id and m}
            if not shares:
                return []
            # stage 1 first learns whom to take activations from (a replica that missed it refuses them)
            told = Command(self.spec.run_hash, step, attempt, "work", named)
            await asyncio.gather(*(self.send(p, told) for p in stage1))
            return await first_failure(*(remote(h, m) for h, m in shares.items()))

        got, rest = await first_failure(own(), others())
        for part in rest:
            got.update(part)
        return [got[mb] for mb in range(self.spec.n_microbatches)]

    # ------------------------------------------------------------------ a head given a share
    async def compute(self, cmd: Command) -> list[float] | str:
        """Forward `cmd`'s microbatches through this head and send them on; their losses once every
        gradient is back, or why not."""
        d = self.daemon
        if d.leads:
            return "this head leads the swarm; it takes no share from another head."
        try:
            async with asyncio.timeout(self.timeout):  # starting waits for gradients too, past the window
                futures = await start_in_window(d, cmd.step, cmd.microbatches, lambda mb: self.batches(cmd.step, mb))
                losses = [float(v) for v in await asyncio.gather(*futures)]
            mbs = cmd.microbatches
            log.info("step %d: computed %d microbatch(es) (%d..%d) for the leading head", cmd.step + 1, len(mbs),
                     min(mbs), max(mbs))
            return losses
        except TimeoutError:
            return f"not every gradient of its share came back within {self.timeout:.0f} s."
        except (LinkError, asyncio.CancelledError) as e:
            if isinstance(e, asyncio.CancelledError) and asyncio.current_task().cancelling():
                raise
            return str(e) or "the attempt was aborted here."


async def start_in_window(daemon: StageDaemon, step: int, mbs: list[int],
                          batch: Callable[[int], torch.Tensor]) -> list[asyncio.Future]:
    """Start `mbs` in order on this head, at most `spec.max_in_flight` of them between forward and
    gradient at once (the next starts as one comes back: what bounds every stage's saved activations);
    their loss futures. LinkError once the attempt they belong to is aborted here: a microbatch
    started after that would be stamped with the next attempt, which did not ask for it."""
    slots, attempt = asyncio.Semaphore(daemon.spec.max_in_flight), daemon.attempt
    futures = []
    for mb in mbs:
        await slots.acquire()
        if (daemon.runner.step, daemon.attempt) != (step, attempt):
            raise LinkError(f"attempt {attempt} of step {step + 1} was superseded here before microbatch {mb} "
                            f"was started.")
        fut = await daemon.start_microbatch(step, mb, batch(mb))
        fut.add_done_callback(lambda _: slots.release())
        futures.append(fut)
    return futures


async def serve_work(daemon: StageDaemon, cmd: Command,
                     compute: Callable[[Command], Awaitable[list[float] | str]] | None) -> CommandReply:
    """A peer's side of a "work" command: a head computes its share, stage 1 notes the named heads."""
    d, n = daemon, daemon.spec.n_microbatches
    deadline = time.monotonic() + d.future_step_wait
    while (cmd.step > d.runner.step or d.stepping) and time.monotonic() < deadline:
        d._step_changed.clear()  # the leader's apply of the last step may still be on its way here
        try:
            await asyncio.wait_for(d._step_changed.wait(), timeout=max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            pass
    def reply(outcome: str, reason: str = "", losses: list[float] | None = None) -> CommandReply:
        return CommandReply(cmd.step, cmd.attempt, outcome, d.runner.microbatches_done(), reason=reason,
                            losses=losses or [])
    if cmd.step != d.runner.step:
        return reply("behind" if cmd.step > d.runner.step else "ahead", "not at this step.")
    if cmd.attempt < d.attempt:
        return reply("failed", "the attempt was superseded here.")
    if any(mb >= n for mb in cmd.microbatches):
        return reply("failed", f"microbatches must be in 0..{n - 1}.")
    await d.adopt_attempt(cmd.attempt)
    if d.stage == 1 and not cmd.microbatches:
        if not cmd.candidates:
            return reply("failed", "a work command to stage 1 names the heads, the leader first.")
        d.feeders = ((cmd.step, cmd.attempt), cmd.candidates[0], frozenset(cmd.candidates))
        return reply("ok")
    if d.stage != 0 or compute is None or not cmd.microbatches or d.peer_id not in cmd.candidates:
        return reply("failed", "this peer computes no share of stage 0.")
    got = await compute(cmd)
    return reply("failed", got) if isinstance(got, str) else reply("ok", losses=got)

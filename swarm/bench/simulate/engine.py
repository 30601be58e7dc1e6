"""The simulator's engine: asyncio on a virtual clock, so the project's own async code (the
router, placement's stage choice, the link shaper) runs unchanged while hours of a swarm take
seconds.

`VirtualLoop` is an asyncio event loop whose `time()` is a number it owns. Its selector never
waits: asked to block for t seconds (nothing is ready until the next timer), it adds t to the
clock and returns at once, so the loop jumps from event to event. There is no I/O: a coroutine
that waits for a socket or another thread would wait forever, and a loop with nothing scheduled
and nothing ready (every coroutine waiting on a future nobody will resolve) is a deadlock, which
`select` turns into `SimulationStuck` instead of blocking.

`Worker` is a device that runs jobs one at a time in arrival order (a stage's worker thread:
`peer/daemon/daemon.py` runs every job on one thread): a job of s seconds that arrives at t starts at
max(t, when the previous job ends) and ends s later. Workers that share a machine's cores (a
local swarm on one CPU) run their jobs on `SharedCores`: k jobs on c cores each progress at
min(1, c / k) of a core (processor sharing), so a job of s seconds alone takes s.

`SendLine` is a peer's send order (swarm/net/send_order.py, `swarm peer --send-order fifo`, the default): its
activations and gradients take the uplink one at a time, in the order they were sent, each as soon as the one
before has left (its last byte, the link's `on_sent`), so the latency of both overlaps; other frames share the
uplink with them as before.
"""
from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SimulationStuck(RuntimeError):
    """Every coroutine of the simulation waits for something nobody will do."""


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


class _NoWaitSelector(selectors.BaseSelector):
    """A selector that advances the virtual clock by the timeout instead of waiting."""

    def __init__(self, clock: _Clock) -> None:
        self._clock = clock
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj, events, data=None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list:
        if timeout is None:
            raise SimulationStuck("the simulation has nothing scheduled and every coroutine waits: a deadlock.")
        self._clock.now += max(0.0, timeout)
        return []

    def get_map(self):
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock that starts at 0 (module docstring)."""

    def __init__(self) -> None:
        self._vclock = _Clock()
        super().__init__(selector=_NoWaitSelector(self._vclock))

    def time(self) -> float:
        return self._vclock.now


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a fresh `VirtualLoop`; returns its result."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()


def now() -> float:
    """The running loop's clock (virtual inside `run_virtual`)."""
    return asyncio.get_running_loop().time()


_TICK = 1e-8  # seconds: the shortest wait SharedCores asks of the loop (above asyncio's clock resolution)


class SharedCores:
    """c cores shared by the jobs running on them (module docstring)."""

    def __init__(self, cores: float) -> None:
        self.cores = cores
        self._left: dict[int, float] = {}  # job -> core-seconds still to run
        self._done: dict[int, float] = {}
        self._updated = 0.0
        self._ids = 0

    def _speed(self) -> float:
        return min(1.0, self.cores / len(self._left)) if self._left else 1.0

    def _advance(self, t: float) -> None:
        while self._left and self._updated < t:
            speed, smallest = self._speed(), min(self._left.values())
            if self._updated + smallest / speed <= t:
                self._updated += smallest / speed
                for k in list(self._left):
                    self._left[k] -= smallest
                    if self._left[k] <= 1e-12:
                        del self._left[k]
                        self._done[k] = self._updated
            else:
                for k in self._left:
                    self._left[k] -= (t - self._updated) * speed
                self._updated = t
        self._updated = max(self._updated, t)

    async def run(self, seconds: float) -> None:
        self._advance(now())
        self._ids += 1
        job = self._ids
        self._left[job] = seconds
        while job not in self._done:
            # the next end among the running jobs; an arrival meanwhile only slows them, so look again then.
            # Never sooner than _TICK: asyncio runs a timer due within its clock resolution (1 ns) without
            # moving the clock, so a job with less than that left would be looked at again forever.
            await asyncio.sleep(max(min(self._left.values()) / self._speed(), _TICK))
            self._advance(now())
        del self._done[job]


class Worker:
    """One device that runs jobs one at a time, in arrival order (module docstring). A job cancelled
    while it waits never runs (the daemon skips the jobs of an aborted attempt); one cancelled while
    it runs holds the device until it ends (a worker thread cannot be interrupted)."""

    def __init__(self, cores: SharedCores | None = None) -> None:
        self.busy_s = 0.0
        self.cores = cores
        self._lock = asyncio.Lock()  # wakes its waiters in order

    async def run(self, seconds: float) -> None:
        async with self._lock:
            self.busy_s += seconds
            job = asyncio.ensure_future(self.cores.run(seconds) if self.cores is not None else asyncio.sleep(seconds))
            try:
                await asyncio.shield(job)
            except asyncio.CancelledError:
                await job
                raise


class SendLine:
    """One peer's ordered frames, first come first served on its uplink (module docstring)."""

    def __init__(self) -> None:
        self._turn = asyncio.Lock()  # wakes its waiters in order

    async def send(self, link, nbytes: int) -> None:
        """`link.send(nbytes)` once every frame lined up before has left; the turn passes on when this one has."""
        await self._turn.acquire()
        held = True

        def left() -> None:
            nonlocal held
            if held:
                held = False
                self._turn.release()
        try:
            await link.send(nbytes, left)
        finally:
            left()  # cancelled, or a link that does not say when the last byte left

"""An event loop whose clock skips the time in which nothing can happen: the in-memory swarms' deadline
waits (a peer's patience, a probe's `dead_after`, retry back-off, a replica's grace), at no cost in what
the tests prove (issue 52, item 6: the fast lane spent minutes waiting out such timers).

`IdleSkippingLoop.time()` is the real monotonic clock plus a skew. When the loop would block in `select`
for t seconds (nothing is ready until its next timer), and no job it handed to a thread
(`run_in_executor`, `asyncio.to_thread`: a stage's worker, a hash) is running, and nothing is waiting to
be read (a thread's `call_soon_threadsafe`), then nothing can happen in those t seconds but the timer:
the skew grows by t and the loop goes on at once. Otherwise it waits for real, and the clock moves with
real time. So work costs what it costs, on a loaded machine too (a deadline against computation is
still met or missed as it would be), and only pure waiting is skipped. The simulator's `VirtualLoop`
(swarm/bench/simulate/engine.py) jumps from event to event as well, but never waits for real, so it
cannot run real work on threads.

The product reads `time.monotonic()` beside the loop's clock (deadlines computed before a wait, a
probe's last answer), `time.perf_counter()` for the durations it reports (a step's seconds), and the
tests read `time.time()` (a log record's time): while such a loop runs, all three move with its skew, so
every clock of the process agrees with the loop's. A deadline loop that polls with `asyncio.sleep` then
moves on as the timers do (instead of spinning until the real deadline), and a test's bound on how long
something took still measures the waits the product would have made (skipped or not), so it fails as
before when the product waits longer than it should. The product keeps its real clocks: this seam is the
tests' alone (pytest's own timings stay real: it bound its clock functions at import). Only for tests
that start no process and do no I/O (the in-memory swarms): a socket's data would not wake an idle loop
before it jumped. Tests opt in with `@pytest.mark.idle_clock` (tests/conftest.py).
"""
from __future__ import annotations

import asyncio
import selectors
import threading
import time

_real_monotonic, _real_perf_counter, _real_time = time.monotonic, time.perf_counter, time.time


class _SkippingSelector(selectors.DefaultSelector):
    def __init__(self, loop: IdleSkippingLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None):
        loop = self._loop
        if timeout is None or timeout <= 0 or loop.busy_threads:
            return super().select(timeout)
        ready = super().select(0)  # a thread's call_soon_threadsafe, say: handle it first
        if ready or loop.busy_threads:
            return ready
        loop.skew += timeout  # nothing can happen before the next timer: go there at once
        loop.skipped += timeout
        return []


class IdleSkippingLoop(asyncio.SelectorEventLoop):
    """An event loop that skips its idle waits (module docstring)."""

    def __init__(self) -> None:
        self.skew = 0.0
        self.skipped = 0.0  # seconds skipped in all
        self.busy_threads = 0  # jobs handed to threads and not yet done
        self._lock = threading.Lock()
        super().__init__(selector=_SkippingSelector(self))

    def time(self) -> float:
        return _real_monotonic() + self.skew

    def run_in_executor(self, executor, func, *args):
        with self._lock:
            self.busy_threads += 1
        try:
            future = super().run_in_executor(executor, func, *args)
        except BaseException:
            self._done(None)
            raise
        future.add_done_callback(self._done)  # runs on the loop once the job's result is in
        return future

    def _done(self, _future) -> None:
        with self._lock:
            self.busy_threads -= 1


class idle_clock:
    """A factory of `IdleSkippingLoop`s for pytest-asyncio (tests/conftest.py): while one of them is open,
    `time.monotonic`, `time.perf_counter` and `time.time` move with its skew (module docstring)."""

    def __call__(self) -> IdleSkippingLoop:
        loop = IdleSkippingLoop()
        clocks = (lambda: _real_monotonic() + loop.skew, lambda: _real_perf_counter() + loop.skew,
                  lambda: _real_time() + loop.skew)
        time.monotonic, time.perf_counter, time.time = clocks
        close = loop.close

        def closing() -> None:
            if time.monotonic is clocks[0]:
                time.monotonic, time.perf_counter, time.time = _real_monotonic, _real_perf_counter, _real_time
            close()
        loop.close = closing
        return loop

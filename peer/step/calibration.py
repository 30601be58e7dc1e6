"""`Calibration`: a standby head measures what it can compute, so that it announces a speed, not 0.

A head that does not lead passes no traffic, yet it is the swarm's spare leader. On standing by
(and again every `period` seconds while it stands by) it times one forward and backward of one
microbatch of the run through its own stage state, on the stage's worker thread, and announces

    compute speed = microbatch tokens / seconds of that forward+backward      (tokens = B x T)

This is a capacity, not traffic: the leading head announces tokens of a step / wall time of the
step, and the other replicas the tokens they passed on over ~10 s (`peer/daemon/inbound.py`), both of
which include waiting on the network and on the other stages, so they are at most their own
capacity. How placement uses the sum: `swarm/replicas/placement.py`.

Nothing of the replica's training is touched: the backward is `torch.autograd.grad` on the
stage's parameters (no `.grad` written), no optimizer, step, attempt or basis statistic changes,
the batch is the run's own deterministic microbatch (`peer/data/batches.py`: its own generator, not the
global RNG streams), and it runs on the worker after whatever was queued (an apply never runs
under it). Its cost is held to at most `budget` of the head's time: after a measurement that
took t seconds (twice) the next waits at least 2 t / budget.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from peer.daemon.daemon import StageDaemon

log = logging.getLogger(__name__)

PERIOD_S = 300.0  # a standby head measures again this often (the device's load changes)
BUDGET = 0.01  # at most this fraction of a standby head's time goes to measuring


def time_forward_backward(daemon: StageDaemon, tokens: torch.Tensor, repeats: int = 2) -> float:
    """Worker thread: seconds of one forward and backward of `tokens` ([B, T+1]) through the stage, the
    least of `repeats` runs (the first pays one-off costs: allocations, kernel choice); gradients are taken
    with autograd.grad (d sum(out) / d theta), so nothing of the replica's state changes."""
    runner = daemon.runner
    dev = torch.device(runner.device)
    tokens = tokens.to(dev)
    best = float("inf")
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        out = runner.output(tokens, None)
        grads = torch.autograd.grad(out, runner.params, grad_outputs=torch.ones_like(out), allow_unused=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
        del grads, out
    return best


class Calibration:
    def __init__(self, daemon: StageDaemon, batches: Callable[[int, int], torch.Tensor], *,
                 period: float = PERIOD_S, budget: float = BUDGET) -> None:
        if not daemon.runner.is_first:
            raise ValueError("only a head measures its compute speed.")
        self.daemon, self.batches, self.period, self.budget = daemon, batches, period, budget
        self.speed: float | None = None  # tokens/s of the last measurement
        self.measurements = 0
        self._next = 0.0  # time.monotonic() from which the next measurement may run

    def start(self) -> None:
        """Measure in the background (a daemon task) if a measurement is due and none runs."""
        if time.monotonic() >= self._next:
            self._next = float("inf")  # one at a time; `measure` sets the next time
            self.daemon.spawn(self.measure())

    async def measure(self) -> float:
        """Time one microbatch of the step in progress, set the daemon's announced throughput to the
        compute speed and announce it; returns the speed in tokens/s."""
        d = self.daemon
        try:
            tokens = self.batches(d.runner.step, 0)
            seconds = max(await d.run(time_forward_backward, d, tokens), 1e-9)
        except BaseException:
            self._next = time.monotonic() + self.period  # not again at once: it failed for a reason
            raise
        ntokens = tokens.shape[0] * (tokens.shape[1] - 1)
        self.speed, self.measurements = ntokens / seconds, self.measurements + 1
        self._next = time.monotonic() + max(self.period, 2 * seconds / self.budget)  # it ran twice
        if not d.leads:  # it may have taken the lead meanwhile: then the step's figure stands
            d.throughput = self.speed
            await d.directory.announce(d.status())
        log.info("standby head: one microbatch's forward+backward took %.3f s: ~%.0f tokens/s", seconds, self.speed)
        return self.speed

    def reset(self) -> None:
        """Measure again at the next chance (this head stood by again after leading)."""
        self._next = 0.0

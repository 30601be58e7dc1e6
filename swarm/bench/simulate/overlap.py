"""Overlapped steps on the simulated swarm (issue 54 item 3): what one-step-stale weights would buy in time.

Today's step (step.py `StepDriverModel`) is synchronous: every microbatch's forward through the S stages, its
backward back, then the commit (reduce and apply), and only then the next step's first forward. With one-step-
stale weights (PipeDream-2BW; the in-process pipeline's "stale1" schedule, peer/runner/pipeline.py)

    W_{t+1} = W_t - update_t(grad f(W_{t-1}; batch_t)),

step t's passes need W_{t-1}, i.e. the commit of step t-2, not of step t-1. So `OverlapDriverModel` starts
step t's microbatches once

- the head has finished step t-1's forward jobs (the stages' workers run jobs in arrival order and the send
  lines keep each sender's order, so at every stage step t's forwards queue behind step t-1's), and
- step t-2's commit is done (its update is applied before step t's forward),

and commits the steps in order, each once its own gradients are in and the previous commit is done. The
latency of the 2 (S - 1) crossings and the pipeline's fill and drain then overlap the next step's work, and
the steady step is bounded below by the busiest resource, not by the chain of crossings:

    step_s >= max( max_s (M (f_s + b_s) + a_s),  max_host bytes sent a step / uplink rate )

(`busiest_resource_s`: M microbatches, f_s, b_s, a_s a stage's forward, backward and apply seconds). No churn
is modelled on this schedule (the record setting has none): a failure here is a bug, raised as such.
"""
from __future__ import annotations

import asyncio

from .engine import now
from .hardware import StageWork, WireBytes
from .step import StepDriverModel, StepRecord, _all


class OverlapDriverModel(StepDriverModel):
    """Two steps in flight on one-step-stale weights (module docstring)."""

    async def run(self, steps: int | None = None, seconds: float | None = None) -> None:
        if steps is None:
            raise ValueError("the overlapped schedule runs a number of steps")
        leader = await self._lead()
        if leader is None or not await self._covered():
            raise RuntimeError("the overlapped schedule needs every stage covered from the start")
        commits: list[asyncio.Task] = []
        self._forwards, self._step_forwarded = 0, []  # the leader's forwards done; per step, all of them done
        for t in range(steps):
            if t >= 2:
                await commits[t - 2]  # W_{t-1} is applied: step t's passes may run
            if t >= 1:
                await self._step_forwarded[t - 1].wait()  # the head's worker has step t-1's forwards behind it
            self._step_forwarded.append(asyncio.Event())
            previous = commits[t - 1] if t else None
            commits.append(asyncio.ensure_future(self._overlapped_step(leader, previous)))
        await _all(commits)

    def _forwarded(self) -> None:
        # the leader's worker runs its jobs in arrival order, so its forwards end in step order: every M-th
        # ends a step's forwards
        self._forwards += 1
        if self._forwards % self.opts.microbatches == 0:
            self._step_forwarded[self._forwards // self.opts.microbatches - 1].set()

    async def _overlapped_step(self, leader, previous: asyncio.Task | None) -> None:
        t0 = now()
        await self._head(leader, leader, self.opts.microbatches)
        microbatch_s = now() - t0
        if previous is not None:
            await previous  # commits apply in step order
        t1 = now()
        await self._commit(leader)
        self.step += 1
        self.swarm.stepped(self.step)
        self.records.append(StepRecord(self.step, now(), 1, microbatch_s, now() - t1))

    async def _never(self) -> None:
        raise RuntimeError("a frame was lost on the overlapped schedule, which models no failure")


def busiest_resource_s(work: StageWork, wire: WireBytes, microbatches: int, uplink_bps: float) -> dict:
    """The lower bounds of a steady overlapped step (module docstring): the busiest stage's compute and the
    busiest host's uplink (a middle stage sends M activations and M gradients a step; the ends M of one)."""
    apply = work.apply or (0.0,) * len(work.forward)
    compute = max(microbatches * (f + b) + a for f, b, a in zip(work.forward, work.backward, apply))
    n = len(work.forward)
    sent = [microbatches * ((wire.activation if s < n - 1 else 0) + (wire.gradient if s > 0 else 0))
            for s in range(n)]
    link = max(sent) * 8 / uplink_bps
    return {"compute_s": compute, "link_s": link, "bound_s": max(compute, link)}

"""`MicrobatchPhase`: the first half of an attempt as the leading head drives it (`StepDriver`, peer/step/driver.py).

Every microbatch of the attempt goes out, split over the live heads (peer/commit/head_work.py), and every gradient
must come back within a deadline that follows the measured step time: `first_timeout` for the first step (nothing
measured yet), then 4x an EWMA of the phase's seconds, `min_timeout` at least. A peer that held work of the last
step and stops answering meanwhile ends the attempt at once (`AttemptWatch`) instead of at the deadline.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import torch

from peer.commit.commit import StepCommit
from peer.commit.head_work import HeadWork
from peer.daemon.daemon import StageDaemon
from peer.daemon.interfaces import LinkError
from peer.daemon.step_log import AttemptFailed
from protocol.step_record import StepRecord, data_digest

from .attempt_watch import AttemptWatch

log = logging.getLogger(__name__)


class MicrobatchPhase:
    def __init__(self, daemon: StageDaemon, commit: StepCommit, work: HeadWork,
                 batches: Callable[[int, int], torch.Tensor], members: Callable[[], Awaitable[dict[str, int]]],
                 watch: AttemptWatch | None, *, min_timeout: float, first_timeout: float,
                 sign_record: Callable[[StepRecord], StepRecord] | None) -> None:
        self.daemon, self.commit, self.work, self.batches = daemon, commit, work, batches
        self.spec, self.peer_id = daemon.spec, daemon.peer_id
        self.members, self.watch = members, watch  # members: every live peer -> its stage (this head included)
        self.min_timeout, self.first_timeout, self.sign_record = min_timeout, first_timeout, sign_record
        self._step_seconds: float | None = None  # EWMA of a step's microbatch phase

    def timeout(self) -> float:
        if self._step_seconds is None:
            return self.first_timeout
        return max(self.min_timeout, 4.0 * self._step_seconds)

    async def run(self, step: int, attempt: int) -> tuple[list[float], int, bytes]:
        """Every microbatch of the attempt, split over the live heads: their losses, the tokens they held, and the
        encoded signed `StepRecord` of the data fed (b"" without `sign_record`), which every reduce command
        carries so that the standby heads check it."""
        await self.daemon.adopt_attempt(attempt)
        t0, fed = time.monotonic(), [self.batches(step, mb) for mb in range(self.spec.n_microbatches)]  # all heads'
        tokens = sum(batch.shape[0] for batch in fed) * self.spec.seq_len
        record = self.sign_record(StepRecord(self.spec.run_hash, step, attempt, self.peer_id,
                                             data_digest(fed))).encode() if self.sign_record else b""
        try:
            # asyncio.timeout, not wait_for: 3.11's cancels the gather unread ("exception was never retrieved")
            async with asyncio.timeout(self.timeout()):
                losses = await self._gather_watched(self.work.run(step, attempt, fed), step)
        except TimeoutError:
            raise AttemptFailed(f"not every gradient came back within {self.timeout():.0f} s") from None
        except (LinkError, asyncio.CancelledError) as e:
            if isinstance(e, asyncio.CancelledError) and asyncio.current_task().cancelling():
                raise
            raise AttemptFailed(str(e) or "a microbatch was dropped", getattr(e, "peer", None)) from None
        seconds = time.monotonic() - t0
        self._step_seconds = seconds if self._step_seconds is None else 0.8 * self._step_seconds + 0.2 * seconds
        return losses, tokens, record

    async def _gather_watched(self, work: Awaitable[list[float]], step: int) -> list[float]:
        """The losses, or AttemptFailed once a peer that did the last step's work stops answering (`AttemptWatch`)."""
        gathered = asyncio.ensure_future(work)
        if self.watch is None:
            return await gathered
        # cancelled below, a gather ends with CancelledError set as its exception: read it, or asyncio logs it
        gathered.add_done_callback(lambda f: f.cancelled() or f.exception())

        async def others() -> list[str]:
            return [p for p in await self.members() if p != self.peer_id and p in (self.commit.workers or [p])]
        watch = asyncio.ensure_future(self.watch.first_silent(others, step))
        try:
            done, _ = await asyncio.wait({gathered, watch}, return_when=asyncio.FIRST_COMPLETED)
            if gathered not in done and watch.exception() is not None:  # the watch broke, not a peer: wait on
                log.warning("the watch over step %d's peers failed (%s)", step + 1, watch.exception())
                await gathered
                done = {gathered}
        finally:
            if not gathered.done():
                gathered.cancel()
            watch.cancel()
        if gathered in done:
            return gathered.result()
        silent = watch.result()
        raise AttemptFailed(f"peer {silent[-8:]} stopped answering while it held work of the step", silent)

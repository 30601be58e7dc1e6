"""Sending a microbatch on with a deadline: a replica of the next stage that holds it longer than the
deadline is banned and the microbatch goes to another one at once. Mixed into `StageDaemon`
(peer/daemon/daemon.py), whose state (the courier, the directory, the microbatches out and their round
trips) these methods use."""
from __future__ import annotations

import asyncio
import logging
import time

from protocol.wire import KIND_ACTIVATION, Header

log = logging.getLogger("peer.daemon.daemon")  # its messages are the daemon's

DEADLINE_FACTOR = 3.0  # a microbatch's deadline: this many times the stage's measured round trip...
DEADLINE_FLOOR_S = 1.0  # ...but never less than this (per boundary below), whatever was measured
RTT_DECAY = 0.7


class MicrobatchForwarding:
    def deadline(self) -> float | None:
        """Seconds a replica of the next stage may hold a microbatch before it counts as failed:

            deadline = m x max(floor, k x rtt)

        with rtt the EWMA of this stage's measured round trips (activation out, gradient back),
        k = DEADLINE_FACTOR, floor = `deadline_floor`, and m = n_stages - 1 - stage the boundaries
        from here to the last stage (a round trip from here holds any stage below's re-send, so
        each stage waits longer than the next one does). None until a round trip was measured."""
        if self._round_trip is None:
            return None
        depth = self.spec.n_stages - 1 - self.stage
        return depth * max(self.deadline_floor, DEADLINE_FACTOR * self._round_trip)

    def _answered(self, mb: int, seconds: float | None) -> None:
        """Microbatch `mb`'s gradient came back after `seconds` (None: its attempt ended)."""
        if seconds is not None:
            old = self._round_trip
            self._round_trip = seconds if old is None else RTT_DECAY * old + (1 - RTT_DECAY) * seconds
        fut = self._replies.pop(mb, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _forward(self, h: Header, body: bytes, ntokens: int) -> None:
        """Send a boundary activation to a replica of the next stage and remember which one; if its
        gradient is not back within `deadline()`, ban that replica and send it to another at once
        (its late gradient, if any, is refused: it must come from the replica that holds the microbatch)."""
        missed: set[str] = set()
        holder: str | None = None
        said = self.boundary.sending(h.step, h.attempt, h.microbatch, body, keep=self.runner.is_first)

        def chosen(peer: str | None) -> None:
            nonlocal holder
            holder = peer
            if peer is None:
                self._downstream.pop(h.microbatch, None)
            elif self.current(h):
                self._downstream[h.microbatch] = (peer, time.monotonic())

        while self.current(h):  # until the attempt is aborted while this stage computed or waited
            reply = self._replies[h.microbatch] = asyncio.get_running_loop().create_future()
            deadline, holder, t0 = self.deadline(), None, time.monotonic()
            try:
                async with asyncio.timeout(deadline):
                    peer = await self.courier.send(self.stage + 1, KIND_ACTIVATION, body, ntokens, chosen=chosen,
                                                   exclude=missed, h=h, said=said)
                    if not self.current(h):
                        self.directory.release(peer, None)  # superseded while it was on its way
                        return
                    await reply
                return
            except TimeoutError:
                if holder is None:
                    continue  # the deadline passed while the router looked for a replica: nothing is out yet
                if self._downstream.get(h.microbatch, ("",))[0] != holder or not self.current(h):
                    return  # answered, or aborted, just as the deadline passed
                others = {p.peer_id for p in await self.directory.members(self.stage + 1)} - missed - {holder}
                if holder in self._returned and not others & self._returned:
                    # a loaded machine can be slow: the last replica known to answer is waited for, not
                    # banned (that would leave the stage's microbatches to replicas that never answered)
                    log.warning("stage %d: replica %s holds microbatch %d past its deadline (%.1f s), and no other "
                                "replica of stage %d has answered this peer yet: waiting for it", self.stage,
                                holder[-8:], h.microbatch, deadline, self.stage + 1)
                    await reply
                    return
            log.warning("stage %d: replica %s missed its %.1f s deadline for microbatch %d of step %d; banning it "
                        "and sending the microbatch to another replica", self.stage, holder[-8:],
                        time.monotonic() - t0, h.microbatch, h.step + 1)
            self.directory.report_failure(holder)
            self.directory.release(holder, None)
            self._downstream.pop(h.microbatch, None)
            missed.add(holder)
            self.missed_deadlines += 1

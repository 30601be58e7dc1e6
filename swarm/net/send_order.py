"""`SendOrder`: a peer's pipeline messages leave its uplink one at a time, in the order they were sent.

Why: a home uplink (and the libp2p streams over it, and the built-in shaper that models it) shares
its rate among the frames in flight. A head that sends 8 microbatches' activations at once on a
link that takes T per frame has all 8 arrive together at 8T, and the next stage starts its first
microbatch only then; its gradients, sent together too, all arrive at 16T. The pipeline never fills:
each link is busy half the step. Sent one after the other, the first arrives at T and the next
stage computes and sends its gradient back while the head's link carries the second: a step of M
microbatches over two stages takes about (M + 1) T, and each link is busy M / (M + 1) of it
(docs/benchmarks.md, "Links busy").

A frame lines up when it is sent (`line_up`), takes its turn when every frame before it has had
its own, and gives it up once its last byte has left this peer (the shaper's word, or the write's
drain on a real link), not when its reply comes back: the next frame's bytes follow at once, and
the latency of both overlaps. Other kinds (control messages, replies, replica sync) do not wait
for a turn; they share the link as before.

Where the sender cannot see its bytes leave (a real link: the local libp2p daemon takes a frame
into its buffers long before it is on the wire, so "written" says nothing), a frame that takes the
link longer than `HOLD_RTTS` round trips holds its turn until its reply comes back (`holds`): that
costs one round trip per frame and is the only signal such a link gives that the bytes arrived.
Smaller frames, whose transfer is shorter than a round trip, are let go once written: holding them
would leave the link idle most of the time. Before anything is measured a frame holds. The round
trip is the smallest of the recent small requests' (`note_round_trip`; `DEFAULT_RTT_S` for a peer
that sends none), the wire rate is measured on held frames (`note_reply`: bytes / (reply time -
round trip)).

A turn is a lease: if a frame has not left within `LEASE_FACTOR` times what its size took at the
rate measured so far (at least `LEASE_MIN_S`; `LEASE_FIRST_S` before any rate is known), the next
frame starts anyway. A receiver that stops reading (a frozen peer, a stalled stream) then slows this
peer's other sends by one lease, not until its request times out.
"""
from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

__all__ = ["SendOrder", "Turn", "LEASE_MIN_S", "LEASE_FIRST_S", "LEASE_FACTOR"]

LEASE_MIN_S = 1.0
LEASE_FIRST_S = 30.0
LEASE_FACTOR = 4.0
RATE_DECAY = 0.5  # weight of the older rate in the running estimate
HOLD_RTTS = 4.0  # a frame longer on the wire than this many round trips holds its turn until its reply
RTT_SAMPLES = 32  # the round trip is the smallest of this many recent small requests
# the round trip taken until a small request has measured one (a peer that sends only activations or gradients
# never does): a home-to-home round trip; too large only makes frames of up to HOLD_RTTS of it go unheld
DEFAULT_RTT_S = 0.1


class Turn:
    """One frame's place in the line and then its turn on the uplink. `await wait()` until it is this
    frame's turn; `release()` (idempotent, in either state) leaves the line or hands the turn on."""

    def __init__(self, order: SendOrder, nbytes: int) -> None:
        self._order, self.nbytes = order, nbytes
        self._granted = asyncio.get_running_loop().create_future()
        self.started: float | None = None  # when the turn came
        self.released = False
        self._timer: asyncio.TimerHandle | None = None

    async def wait(self) -> Turn:
        await asyncio.shield(self._granted)  # a cancelled waiter must not cancel the grant itself
        return self

    def release(self, measured: bool = True) -> None:
        """Leave the line, or give the turn up; `measured=False` when the frame did not really leave
        (an error, a cancel), so that its time is not taken as the link's rate."""
        if self.released:
            return
        self.released = True
        if self._timer is not None:
            self._timer.cancel()
        self._order._done(self, measured and self.started is not None)


class SendOrder:
    """First come first served turns for the frames of one uplink (module docstring)."""

    def __init__(self, *, lease_min_s: float = LEASE_MIN_S, lease_first_s: float = LEASE_FIRST_S,
                 lease_factor: float = LEASE_FACTOR, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_min_s, self.lease_first_s, self.lease_factor = lease_min_s, lease_first_s, lease_factor
        self._clock = clock
        self._holder: Turn | None = None
        self._line: collections.deque[Turn] = collections.deque()
        self.rate: float | None = None  # bytes per second of the frames that left within their turn
        self.expired = 0  # turns handed on because their lease ran out
        self.rtt: float | None = None  # the smallest recent round trip of a small request
        self.wire_rate: float | None = None  # bytes per second of held frames on the wire
        self._rtts: collections.deque[float] = collections.deque(maxlen=RTT_SAMPLES)

    def note_round_trip(self, seconds: float) -> None:
        """A small request's round trip (from its stream being open to its reply)."""
        self._rtts.append(seconds)
        self.rtt = min(self._rtts)

    def holds(self, nbytes: int) -> bool:
        """On a link whose departures are not seen: must a frame of `nbytes` hold its turn until its
        reply? Yes if nbytes / wire_rate > HOLD_RTTS * rtt, or while the wire rate is unmeasured."""
        if self.wire_rate is None:
            return True
        return nbytes / self.wire_rate > HOLD_RTTS * self.round_trip

    @property
    def round_trip(self) -> float:
        """The measured round trip, else DEFAULT_RTT_S."""
        return DEFAULT_RTT_S if self.rtt is None else self.rtt

    def note_reply(self, turn: Turn) -> None:
        """The reply to a frame that held its turn came: its time on the wire is the time since its
        turn began less one round trip."""
        # answered within one round trip: short on the wire (1 ms, so that it counts as fast, not unmeasured)
        wire = max(1e-3, self._clock() - turn.started - self.round_trip)
        if turn.nbytes > 0:
            rate = turn.nbytes / wire
            self.wire_rate = rate if self.wire_rate is None else RATE_DECAY * self.wire_rate + (1 - RATE_DECAY) * rate

    def lease_s(self, nbytes: int) -> float:
        """How long a frame of `nbytes` may hold the turn: max(lease_min_s, lease_factor * nbytes / rate)."""
        if not self.rate:
            return self.lease_first_s
        return max(self.lease_min_s, self.lease_factor * nbytes / self.rate)

    @property
    def queued(self) -> int:
        return len(self._line)

    def line_up(self, nbytes: int) -> Turn:
        """Take a place in the line now (the order frames are sent in is the order of these calls);
        the turn comes at once if the uplink is free."""
        turn = Turn(self, nbytes)
        self._line.append(turn)
        self._next()
        return turn

    def _next(self) -> None:
        while self._holder is None and self._line:
            turn = self._line.popleft()
            if turn.released:
                continue
            self._holder, turn.started = turn, self._clock()
            turn._timer = asyncio.get_running_loop().call_later(self.lease_s(turn.nbytes), self._expire, turn)
            turn._granted.set_result(None)

    def _expire(self, turn: Turn) -> None:
        if not turn.released:
            self.expired += 1
            turn.release(measured=False)

    def _done(self, turn: Turn, measured: bool) -> None:
        if measured and turn.nbytes > 0:
            took = self._clock() - turn.started
            if took > 0:
                rate = turn.nbytes / took
                self.rate = rate if self.rate is None else RATE_DECAY * self.rate + (1 - RATE_DECAY) * rate
        if self._holder is turn:
            self._holder = None
            self._next()

"""How a reduce tells a replica that is slow from one whose contribution will never come, so
that a replica that died mid-reduce costs seconds instead of the whole reduce timeout.

`ReduceWatch` (the asking side): while a reduce waits for contributions (`gather`), it asks
each replica still missing, every `period` seconds and one question at a time, how its reduce
of this step and attempt goes (protocol/control.py `ReduceProbe`, sent over `red` like the
contributions, so the same membership check lets it in). What each answer means:

    reducing   it computes or sends its contribution: wait (up to the reduce's deadline, which grows
               with the contribution's bytes, peer/daemon/transfer_time.py: a large one over a home uplink
               may take minutes, and the answer is small); one still missing at the deadline is
               slower than the slowest uplink waited for, and is named (`blamed`) like one that withholds
    idle       it is at this step and attempt but began no reduce: given up on once it has said
               so for `dead_after` s (the driver sends its reduce commands together, so a replica
               still without one then will not get it: its command was refused, or the driver died)
    ended      its reduce is over, so whatever it sent us is here already: given up on at once, and
               named (`blamed`) if its contribution is not here (it withheld it, or its uplink could not
               send it in the time the floor allows: its own offer gave up)
    elsewhere  it went on to a newer attempt or another step: given up on at once
    (out)      this peer's directory says it is out of the run (banned, or a head whose lease the
               swarm key revoked meanwhile: it may still answer "reducing", and would keep the reduce
               waiting until its deadline): given up on at once, not named
    (failure)  no answer: given up on when the requests fail (a closed connection: its process
               died) and the last answer is `dead_after` s old, or when one request stays
               unanswered for `mute_after` s (its machine vanished; a live peer behind a full
               uplink may answer late, so that wait is longer)

Any other reply (a refusal, say) comes from a live peer and counts as "reducing"; but once some
contribution is here, the others have `straggle_after` s, or `straggle_factor` times what that one
took if longer, before they count as withheld (a replica that says it reduces and never sends:
issue 21), and the reduce names them (`blamed`). Giving up ends
the reduce with a reason; the driver then aborts the attempt and re-drives the step, so no
microbatch is lost or counted twice.

`RunningReduces` (the answering side): the reduces in progress here, and the state to answer.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from peer.daemon.interfaces import MessageLink
from peer.daemon.transfer_time import TOO_SLOW
from protocol.control import decode_probe_reply
from protocol.wire import KIND_REDUCE, WireError

T = TypeVar("T")


@dataclass
class _Member:
    heard: float  # when it last answered (at first when the watch began: it had just taken our contribution)
    asked: float  # when the last probe went out
    idle_since: float | None = None  # since when it says it began no reduce
    failing: str = ""  # why the last probe failed, if it did
    verdict: str | None = None  # why the reduce gives up on it
    withheld: bool = False  # it ended its reduce and its contribution is not here: named (`blamed`)
    task: asyncio.Task | None = None  # the probe in flight


class ReduceWatch:
    def __init__(self, link: MessageLink, probe: bytes, members: list[str], arrived: asyncio.Event, *,
                 period: float, dead_after: float, mute_after: float, straggle_after: float | None = None,
                 straggle_factor: float = 4.0, out: Callable[[str], bool] = lambda peer: False) -> None:
        self.link, self.probe, self.members, self.arrived = link, probe, members, arrived
        self.out = out  # the directory's `refuses`: this replica takes no contribution from such a member
        self.period, self.dead_after, self.mute_after = period, dead_after, mute_after
        # withheld: once some contribution is here, the rest have max(straggle_after, factor x its wait) more
        self.straggle_after, self.straggle_factor = straggle_after, straggle_factor
        self.blamed: list[str] = []  # the members that withheld their contribution, if that ended the gather
        now = time.monotonic()
        self._members = {p: _Member(now, now) for p in members}
        self._start, self._last, self._count = now, now, 0

    async def gather(self, box: Callable[[], Mapping[str, T]], current: Callable[[], bool],
                     timeout: float) -> dict[str, T] | str:
        """Every member's entry of `box()` (the contributions that arrived; `arrived` is set when
        one does) once all are there, or why they will not all be: the attempt is no longer
        `current()`, a member will not send, or `timeout` seconds passed."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                got = box()
                missing = [p for p in self.members if p not in got]
                if not missing:
                    return {p: got[p] for p in self.members}
                if not current():
                    return "the attempt was superseded during the reduce."
                if time.monotonic() > deadline:  # alive (the probes say so) but slower than the slowest uplink
                    self.blamed = list(missing)  # waited for: named, so that the step goes on without them
                    return (f"no contribution arrived from {', '.join(p[-8:] for p in missing)} within {timeout:g} s "
                            f"({TOO_SLOW})")
                if (why := self._check(missing)) is not None or (why := self._withheld(missing)) is not None:
                    return why
                self.arrived.clear()
                try:  # woken by a contribution or a probe's answer, or when the next probe is due
                    await asyncio.wait_for(self.arrived.wait(),
                                           timeout=max(0.01, min(self.period, deadline - time.monotonic())))
                except TimeoutError:
                    pass
        finally:
            await self._close()

    def _withheld(self, missing: list[str]) -> str | None:
        """Why the `missing` members count as withholding their contributions, or None: a live
        replica that says it is reducing may still hold its contribution back for ever."""
        now, count = time.monotonic(), len(self.members) - len(missing)
        if count > self._count:
            self._count, self._last = count, now
        if self.straggle_after is None or not self._count:
            return None
        grace = max(self.straggle_after, self.straggle_factor * (self._last - self._start))
        if now - self._last <= grace:
            return None
        self.blamed = list(missing)
        return (f"replica {', '.join(p[-8:] for p in missing)} withheld its contribution: the others' were here "
                f"{now - self._last:.1f} s before.")

    def _check(self, missing: list[str]) -> str | None:
        """Why the reduce must give up on one of the `missing` members (one sentence), or None;
        probes the missing members that are due."""
        now = time.monotonic()
        for peer in missing:
            m = self._members[peer]
            if self.out(peer):
                return f"replica {peer[-8:]} is out of the run now (banned, or its lease revoked) during the reduce."
            if m.failing and now - m.heard >= self.dead_after:
                m.verdict = f"stopped answering during the reduce ({m.failing})."
            if m.verdict is not None:
                if m.withheld:
                    self.blamed = [peer]
                return f"replica {peer[-8:]} {m.verdict}"
            if m.task is None and now - m.asked >= self.period:
                m.asked = now
                m.task = asyncio.create_task(self._ask(peer, m))
        return None

    async def _close(self) -> None:
        tasks = [m.task for m in self._members.values() if m.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _ask(self, peer: str, m: _Member) -> None:
        try:
            # the link's own timeout is longer, so that a request that hangs is told from one that failed
            request = self.link.request(peer, KIND_REDUCE, self.probe, timeout=2 * self.mute_after)
            reply = await asyncio.wait_for(request, self.mute_after)
        except TimeoutError:
            m.verdict = f"did not answer for {self.mute_after:g} s during the reduce."
        except Exception as e:  # a dead peer's connection fails in whatever way
            m.failing = str(e)[:120].rstrip(".") or type(e).__name__
        else:
            m.failing = ""
            self._answered(m, reply)
        finally:
            m.task = None
            self.arrived.set()

    def _answered(self, m: _Member, reply: bytes) -> None:
        now = m.heard = time.monotonic()
        try:
            state = decode_probe_reply(reply)
        except WireError:
            state = "reducing"  # a live peer that would not say: it may still send
        if state == "ended":  # it sent us nothing and will not: withheld, or its uplink too slow to (issue 57)
            m.verdict = f"ended its reduce without its contribution reaching this replica (withheld, or {TOO_SLOW})."
            m.withheld = True
        elif state == "elsewhere":
            m.verdict = "went on to another attempt or step during the reduce."
        elif state == "idle":
            m.idle_since = m.idle_since if m.idle_since is not None else m.asked
            if now - m.idle_since >= self.dead_after:
                m.verdict = f"took no part in the reduce (no reduce command reached it in {self.dead_after:g} s)."
        else:
            m.idle_since = None


class RunningReduces:
    """The reduces that run or ran here for the step in progress, by (step, attempt)."""

    def __init__(self) -> None:
        self._running: dict[tuple[int, int], int] = {}  # -> how many run now (0: it ran and ended)

    @contextmanager
    def running(self, step: int, attempt: int) -> Iterator[None]:
        # those ended before are forgotten: a probe of an older attempt is answered "elsewhere" anyway
        self._running = {k: n for k, n in self._running.items() if n > 0}
        key = (step, attempt)
        self._running[key] = self._running.get(key, 0) + 1
        try:
            yield
        finally:
            self._running[key] -= 1

    def any_running(self, step: int) -> bool:
        """Whether a reduce of `step` (any attempt) runs here now."""
        return any(n > 0 for (s, _), n in self._running.items() if s == step)

    def state(self, step: int, attempt: int, here: tuple[int, int]) -> str:
        """The answer to a probe of (step, attempt), `here` being this replica's step and attempt."""
        if step != here[0] or attempt < here[1]:
            return "elsewhere"
        n = self._running.get((step, attempt))
        return "idle" if n is None else "reducing" if n > 0 else "ended"

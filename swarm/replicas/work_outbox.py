"""`WorkOutbox`: the leading head's work records on their way to the coordinator, sent one at a time in the
order they were made, and the ones that reached no coordinator kept for the next one (issue 56).

While the seat is empty (every coordinator down, or a standby not yet in it) a record sent fire-and-forget was
lost: the coordinator that took the seat next never vouched for the steps trained meanwhile, and a joiner whose
donor sat at such a step was refused ("no record vouches for its step N, and none will") and restored an older
snapshot it did not need. Now a record that reached no coordinator stays here, and goes, in order, before the
next record, to whichever coordinator holds the seat then. In order matters: the coordinator vouches for a state
step only if it is newer than every one it holds (`SnapshotVouch.take_states`), so the kept steps must reach it
before the new one.

What is kept (the bound: what a joiner or a restore could still use, as the coordinator itself keeps it):
  - state records: the newest `KEEP_STATES` (64) steps, the coordinator's own window (`vouched.py`);
  - snapshot records: the newest `KEPT_SNAPSHOTS` (2), the snapshots every stage's custodians keep; a restore
    loads no older one. A re-fit's worker list is stripped from a kept record: it is for the re-fit being
    collected at that step, and late it could only start a re-fit of a step gone by;
  - a rollback record, at most one: the one with the lowest target (see `rolled_back`).
A record the coordinator answered, even with a refusal, is not kept: the same bytes get the same answer.
What is not kept: records of steps a rollback undid (`rolled_back` drops them before they are sent), and every
kept record once another head drove a step (`another_led`): this head cannot know whether that head rolled
those steps back, and a vouched hash of an undone step would refuse every honest donor at that step.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine

from protocol.step_record import WorkRecord

from .vouched import KEEP_STATES

log = logging.getLogger(__name__)

KEPT_SNAPSHOTS = 2  # snapshot records kept: every stage's custodians keep its 2 newest snapshots


def _kept_form(record: WorkRecord) -> WorkRecord | None:
    """What of `record` is worth sending late: None for a re-fit's worker list alone."""
    if record.rolled_back_to >= 0:
        return record
    if not (record.state_step or record.snapshot_step):
        return None
    return dataclasses.replace(record, workers={}) if record.workers else record


def _undone(record: WorkRecord, target: int) -> bool:
    """Whether a rollback to `target` undoes what `record` vouches for (a rollback record to `target` or later
    says nothing the new one does not)."""
    if record.rolled_back_to >= 0:
        return record.rolled_back_to >= target
    return max(record.state_step, record.snapshot_step) > target


class WorkOutbox:
    def __init__(self, send: Callable[[WorkRecord], Awaitable[bool]],
                 spawn: Callable[[Coroutine], object]) -> None:
        """`send`: signs and sends one record, True if a coordinator answered; `spawn`: the daemon's."""
        self.send, self.spawn = send, spawn
        self.unsent: list[WorkRecord] = []  # oldest first: kept ones, then any made while one is in flight
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._told = False  # whether the log says records are kept (said once per outage)

    def put(self, record: WorkRecord) -> None:
        self.unsent.append(record)
        self._kick()

    def rolled_back(self, record: WorkRecord) -> None:
        """A rollback record (from `record.step` to `record.rolled_back_to`): the kept records of the undone
        steps go, then the record itself goes out. If it reaches no coordinator it is kept and re-sent: the next
        coordinator may still vouch for undone steps it took before the seat was empty (a standby resumes them
        from the DHT), and would then refuse the re-driven steps' records as not newer and check joiners
        against the undone hashes; where it holds nothing past the target, the record changes nothing there.
        One kept rollback record stands for all: records kept after it are of steps it did not undo."""
        target = record.rolled_back_to
        self.unsent = [r for r in self.unsent if not _undone(r, target)]
        if not any(r.rolled_back_to >= 0 for r in self.unsent):  # an earlier one to a lower target covers it
            self.unsent.append(record)
        self._kick()

    def another_led(self) -> None:
        """Another head drove a step since this head's last record: what this head kept is dropped."""
        if self.unsent:
            log.info("another head drove the swarm meanwhile: %d work records kept for the coordinator are "
                     "dropped (that head may have rolled their steps back)", len(self.unsent))
        self.unsent = []

    async def idle(self, timeout: float) -> None:
        """Wait at most `timeout` s for the records to be sent, or kept after a send reached no coordinator."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            pass

    def _kick(self) -> None:
        if not self._draining:  # one sender at a time: the order is the list's
            self._draining = True
            self._idle.clear()
            self.spawn(self._drain())

    async def _drain(self) -> None:
        try:
            while self.unsent:
                record = self.unsent[0]
                if not await self.send(record):
                    self._keep()
                    return
                self.unsent = [r for r in self.unsent if r is not record]  # a rollback may have dropped it
                if self._told and not self.unsent:
                    log.info("the work records kept while no coordinator was reached are sent")
                    self._told = False
        finally:
            self._draining = False
            self._idle.set()

    def _keep(self) -> None:
        """No coordinator reached: keep what a joiner or a restore could still use (the module docstring)."""
        kept = [k for r in self.unsent if (k := _kept_form(r)) is not None]
        states = [r for r in kept if r.state_step]
        snapshots = [r for r in kept if r.snapshot_step]
        dropped = {id(r) for r in states[:-KEEP_STATES] + snapshots[:-KEPT_SNAPSHOTS]}
        self.unsent = [r for r in kept if id(r) not in dropped]
        if self.unsent and not self._told:
            log.warning("no coordinator reached: this head keeps its work records (snapshot and state hashes) and "
                        "sends them to the next coordinator before its next record")
            self._told = True

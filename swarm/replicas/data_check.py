"""The run's data, checked (issue 20, item 2): every head checks the leading head's step record
before it sums a reduce with it (`StepRecordCheck`), and the coordinator judges what a head
reports (`DataVerdict`) with its own copy of the data, then takes the lease from a leader
that fed other text.

A head's check of a reduce command of step s, attempt a (protocol/step_record.py):

    the record decodes and names (s, a);  peer_id_of(record.signer) == record.leader;
    the signature verifies;  record.data == data_digest(batches(s, m) for m < M)

where batches are this head's own: every head holds the run's data (its sha256 is in the
signed run spec) and regenerates any microbatch. A record that fails is refused (this head
does not sum with that leader). One whose only fault is the digest is the leader's own signed
word that it fed other data: it goes to the coordinator, which recomputes the digest from the
run's data itself, and only if the record is genuine and the digest is not the run's revokes
the leader's lease (`LeaseKeeper.revoke`) and tells every peer to read the lease again. The
steps that leader drove are undone: the new lease orders a rollback to the newest snapshot step,
at most the caught step, that another, trusted head vouched for (`SnapshotVouch.before`: so from
before the liar led), which the next leader carries out (`peer/state/rollback.py`). With no such
snapshot the coordinator says so (an error naming the steps) and the swarm goes on.

A report that does not hold (the record is genuine and its digest is the run's) proves the
reporter's own digest was not the run's: it reads other data than the run's, or lies. A head
that refuses to sum with an honest leader over such a report stalls every step (issue 57,
item 6), so a reporter that is a head (announced on stage 0, or in the lease) loses its lease
the same way (`revoke`, no rollback: it summed nothing, so nothing it did was applied), and
every router then leaves it out of the swarm (`Router.is_banned`). A reporter that is no head
loses only its word (logged). No headcount and no trust in either side decides: the coordinator's own
copy of the data does. A head that refuses and reports nothing is judged on its signed refusal instead, which
the leader sends (swarm/replicas/refusal_verdict.py, with `runs_data` and the same revocation).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection

import torch

from protocol.control import Command, encode_command
from protocol.step_record import StepRecord, data_digest
from protocol.wire import KIND_CONTROL, KIND_DATA_REPORT, ErrorReply, WireError, encode_message
from swarm.trust.signed_records import sign_record, signed_by_leader

log = logging.getLogger(__name__)

REPORT_EVERY_S = 30.0  # a head reports one leader at most this often


def step_digest(batches: Callable[[int, int], torch.Tensor], step: int, n_microbatches: int) -> bytes:
    return data_digest([batches(step, m) for m in range(n_microbatches)])


class StepRecordCheck:
    """A head's `StepCommit.check_record`: why it will not sum with this reduce's leader, or None."""

    def __init__(self, run_hash: str, n_microbatches: int, batches: Callable[[int, int], torch.Tensor],
                 report: Callable[[bytes], Awaitable[None]],
                 on_bad: Callable[[StepRecord], None] | None = None, me: str = "") -> None:
        self.run_hash, self.n_microbatches, self.batches = run_hash, n_microbatches, batches
        self.me = me  # this head: a record it signed itself describes the batches it just fed, unchecked
        self.report, self.on_bad = report, on_bad
        self._reported: dict[str, float] = {}
        self._tasks: set[asyncio.Task] = set()
        # step -> this head's digest of the step's batches, computed ahead (~40 ms for `large` on a CPU core,
        # which the leader would otherwise wait for in every reduce)
        self._digests: dict[int, asyncio.Future] = {}

    def prepare(self, step: int) -> None:
        """Compute the digest of `step` now, on a thread: the leader's reduce of that step needs it."""
        for old in [s for s in self._digests if s < step]:
            del self._digests[old]  # not cancelled: a reduce of that step may still be awaiting it
        if step not in self._digests:
            self._digests[step] = asyncio.ensure_future(
                asyncio.to_thread(step_digest, self.batches, step, self.n_microbatches))

    async def __call__(self, cmd: Command) -> str | None:
        if not cmd.record:
            return "the leader's reduce carries no step record; this head does not sum without one."
        try:
            record = StepRecord.decode(cmd.record, self.run_hash)
        except WireError as e:
            return f"the leader's step record is malformed ({e})"
        if (record.step, record.attempt) != (cmd.step, cmd.attempt):
            return "the leader's step record is for another step or attempt."
        if record.leader == self.me:
            return None  # the leader's own reduce: regenerating and re-hashing its batches would prove nothing
        if not signed_by_leader(record):
            return "the leader's step record is not signed by the leader it names."
        self.prepare(record.step)
        mine = await asyncio.shield(self._digests[record.step])
        if mine == record.data:
            return None
        log.error("head %s fed other data than the run's at step %d (its signed step record says so): this head "
                  "does not sum with it, and reports it to the coordinator", record.leader[-8:], record.step + 1)
        if self.on_bad is not None:
            self.on_bad(record)
        now = time.monotonic()
        if now - self._reported.get(record.leader, float("-inf")) >= REPORT_EVERY_S:
            self._reported[record.leader] = now
            task = asyncio.ensure_future(self.report(cmd.record))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return f"the data of step {record.step + 1} is not the run's (this head's digest differs)."


class DataVerdict:
    """The coordinator's judge of reported step records (served on KIND_DATA_REPORT)."""

    def __init__(self, run_hash: str, n_microbatches: int, batches: Callable[[], Callable[[int, int], torch.Tensor]],
                 revoke: Callable[[str, str, int | None, int], Awaitable[bool]],
                 target: Callable[[str, int], int | None] = lambda head, caught: None,
                 heads: Callable[[], Awaitable[Collection[str]]] | None = None) -> None:
        self.run_hash, self.n_microbatches = run_hash, n_microbatches
        self.heads = heads  # the heads now (announced or in the lease): a false reporter among them loses its lease
        self._make_batches, self._batches = batches, None  # the corpus is read on the first report
        self.revoke = revoke  # (head, why, rollback to, caught step)
        self.target = target  # (head, caught step) -> the snapshot step to roll back to, or None
        self.revoked: set[str] = set()
        self.unfounded = 0  # reports whose record checked out

    async def runs_data(self, record: StepRecord) -> bool:
        """Whether `record`'s data digest is the run's, by this coordinator's own copy of the data."""
        if self._batches is None:
            self._batches = await asyncio.to_thread(self._make_batches)
        return await asyncio.to_thread(step_digest, self._batches, record.step, self.n_microbatches) == record.data

    async def on_report(self, body: bytes, sender: str) -> bytes:
        try:
            record = StepRecord.decode(body, self.run_hash)
        except WireError as e:
            return encode_message(ErrorReply(str(e)))
        if not signed_by_leader(record):
            return encode_message(ErrorReply("the reported step record is not signed by the leader it names."))
        if record.leader in self.revoked:
            return b""
        if await self.runs_data(record):
            self.unfounded += 1
            if sender not in self.revoked and self.heads is not None and sender in await self.heads():
                self.revoked.add(sender)
                log.error("head %s reported head %s's step %d as other data than the run's, but it is the run's: the "
                          "reporting head reads other data than the run's (or lies), and would refuse every honest "
                          "leader; its lease is revoked and the swarm leaves it out", sender[-8:], record.leader[-8:],
                          record.step + 1)
                await self.revoke(sender, f"reported the run's data of step {record.step + 1} as other data", None, 0)
            else:
                log.warning("peer %s reported head %s's step %d, but its data is the run's: the report does not hold",
                            sender[-8:], record.leader[-8:], record.step + 1)
            return encode_message(ErrorReply("the reported step's data is the run's."))
        self.revoked.add(record.leader)
        caught = record.step + 1
        to = self.target(record.leader, caught)
        if to is None:
            log.error("head %s fed other data than the run's at step %d (attempt %d; its own signed record, reported "
                      "by %s): its lease is revoked. No snapshot from before it led is vouched for by another head: "
                      "the steps it drove up to step %d trained on that data and stay applied.",
                      record.leader[-8:], caught, record.attempt, sender[-8:], caught)
        else:
            log.error("head %s fed other data than the run's at step %d (attempt %d; its own signed record, reported "
                      "by %s): its lease is revoked, and the swarm rolls back to the snapshot of step %d (the newest "
                      "from before it led): steps %d-%d are driven again on the run's data.",
                      record.leader[-8:], caught, record.attempt, sender[-8:], to, to + 1, caught)
        await self.revoke(record.leader, f"fed other data than the run's at step {caught}", to, caught)
        return b""


async def tell_to_read_lease(transport, run_hash: str, peers: list[str], timeout: float = 5.0) -> int:
    """Ask every peer to read the lease again now; returns how many answered."""
    body = encode_command(Command(run_hash, 0, 0, "lease"))

    async def one(peer: str) -> bool:
        try:
            await transport.request(peer, KIND_CONTROL, body, timeout=timeout)
            return True
        except Exception:
            return False
    return sum(await asyncio.gather(*(one(p) for p in peers)))


__all__ = ["DataVerdict", "KIND_DATA_REPORT", "StepRecordCheck", "sign_record", "signed_by_leader", "step_digest",
           "tell_to_read_lease"]

"""`WorkRecords`: what a leading head tells the coordinator, each as a `WorkRecord` signed with its
libp2p identity (`protocol/step_record.py`): who did a re-fit step's work, the snapshot hashes every
stage agreed on, the state hashes after each step, and a rollback it is about to order. The
coordinator takes them only from a head its lease names (`swarm/basis/refit.py`) and vouches for
the hashes under the swarm key (`swarm/replicas/vouched.py`). The head also holds the records of hashes it
signed, and re-serves them: while no coordinator holds the seat, a joiner checks a donor's state against them
(`swarm/replicas/head_vouched.py`). A standby head's report of a leader's step record that its own data
contradicts goes the same way (`report_step_record`).

The records go out one at a time, in order, through a `WorkOutbox` (`work_outbox.py`), which keeps the ones that
reached no coordinator (the seat empty) and sends them to the next holder before the next record.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine

from protocol.spec import RunSpec
from protocol.step_record import WorkRecord
from protocol.wire import KIND_DATA_REPORT, KIND_REFUSAL_REPORT
from swarm.basis import BasisSync
from swarm.trust.signed_records import sign_record

from .head_vouched import keys_of
from .work_outbox import WorkOutbox

log = logging.getLogger(__name__)

ROLLBACK_WAIT_S = 10.0  # how long a head waits for the coordinator to forget the undone steps' hashes


class WorkRecords:
    def __init__(self, spec: RunSpec, ctx, sync: BasisSync, spawn: Callable[[Coroutine], object]) -> None:
        """`ctx`: the `ReplicaContext` (identity, peer id, transport, report); `spawn`: the daemon's, for the
        sends (`WorkOutbox`)."""
        self.spec, self.ctx, self.sync, self.spawn = spec, ctx, sync, spawn
        self.sign = sign_record(ctx.sdht.identity)
        self.vouched_step = 0  # the newest snapshot step this head sent the coordinator
        self.outbox = WorkOutbox(self._send, spawn)
        self.last_steps: int | None = None  # the steps done at this head's last commit as leader

    async def _send(self, record: WorkRecord) -> bool:
        return await self.sync.send_work(self.sign(record).encode())

    def after_commit(self, steps: int, workers: dict[int, list[str]],
                     snapshots: tuple[int, dict[int, str]] | None) -> None:
        """After a re-fit step, who did its work (only they vote in the re-fit), and after every stage agreed on
        a newer snapshot, its hashes."""
        if self.last_steps is not None and steps != self.last_steps + 1:  # another head drove the steps between
            self.outbox.another_led()
        self.last_steps = steps
        if steps <= self.vouched_step:  # the swarm rolled back: the snapshots of the steps driven again are new
            self.vouched_step = 0
        refit = self.spec.refits_basis and steps % self.spec.basis_interval == 0
        fresh = snapshots is not None and snapshots[0] > self.vouched_step
        if refit or fresh:
            at, hashes = snapshots if snapshots is not None else (0, {})
            self.vouched_step = max(self.vouched_step, at)
            record = WorkRecord(self.spec.run_hash, steps, self.ctx.peer_id, workers, snapshot_step=at,
                                snapshots=hashes)
            self._hold(self.sign(record))
            self.outbox.put(record)

    def vouch_states(self, steps: int, hashes: dict[int, str]) -> None:
        """The leader's tally of the replicas' state hashes after `steps` steps (peer/checks/state_votes.py)."""
        self.ctx.report.write("state_record", step=steps, hashes={str(s): h for s, h in hashes.items()})
        record = WorkRecord(self.spec.run_hash, steps, self.ctx.peer_id, {}, state_step=steps, states=hashes)
        self._hold(self.sign(record))
        self.outbox.put(record)

    def _hold(self, record: WorkRecord) -> bytes:
        """The signed record's bytes, held to re-serve if it names hashes (`HeldRecords.work`)."""
        body = record.encode()
        self.ctx.sdht.held.keep_work(self.spec.run_hash, dict.fromkeys(keys_of(record), body))
        return body

    async def before_rollback(self, target: int, steps: int) -> None:
        """The swarm rolls back from `steps` to `target`: the coordinator forgets the hashes it vouched for after
        `target` before any replica re-drives a step and checks its state against them. A coordinator away: the
        rollback goes on, and a replica's check of a re-driven step may find it differs (it downloads again); the
        record is kept for the next coordinator, and the kept records of the undone steps are dropped
        (`WorkOutbox.rolled_back`)."""
        self.ctx.sdht.held.forget_work_after(target)  # the records of the steps driven again name other bits
        self.last_steps = target  # the next step this head drives is target + 1
        self.outbox.rolled_back(WorkRecord(self.spec.run_hash, steps, self.ctx.peer_id, {}, rolled_back_to=target))
        await self.outbox.idle(ROLLBACK_WAIT_S)

    async def report_step_record(self, record: bytes) -> None:
        """A leader's step record that this head's data contradicts: the proof, to the coordinator."""
        try:
            if await self.sync.to_coordinator(KIND_DATA_REPORT, record, "this head's report") is None:
                log.warning("could not report the leader's step record to the coordinator")
        except Exception as e:  # the coordinator away: the standby heads still refuse that leader
            log.warning("could not report the leader's step record to the coordinator: %s", e)

    async def report_refusal(self, report: bytes) -> None:
        """The leading head's evidence of a head that refused its reduce under its signature (protocol/refusal.py):
        the coordinator judges it (swarm/replicas/refusal_verdict.py); its refusal, if any, is logged there."""
        try:
            await self.sync.to_coordinator(KIND_REFUSAL_REPORT, report, "this head's evidence of a refusal")
        except Exception as e:  # the coordinator away: this head's router still avoids the refuser for a while
            log.warning("could not send the coordinator a head's refusal of this head's reduce: %s", e)

"""`HeadVouches`: the state and snapshot hashes a joiner checks against while no coordinator vouches for any
(issue 56, item 2): the ones a head that the leader lease names signed in its work records.

After every hashed step the leading head tallies its replicas' state hashes (`peer/checks/state_votes.py`) and
signs the agreed ones into a `WorkRecord` with its libp2p identity (`swarm/replicas/work_records.py`); after every
stage agreed on a snapshot, it signs their hashes too. With a coordinator in the seat, the coordinator takes those
records from the lease's heads only and vouches for the hashes under the swarm key (`vouched.py`). Without one
(`ActiveCoordinator.lapsed`), nobody re-signs them, so the joiner checks the heads' records itself:

- the leading head holds every record it signs (`HeldRecords.work`, the newest `WORK_STEPS` steps), and so does
  every peer that read and checked them; all re-serve them over the record share (kind `rec`, want "work");
- a reader asks the lease's heads first, then the peers it reaches, and takes a record only if it decodes for
  this run, its signature verifies under the key in it, that key's peer id is the record's leader, and the lease
  it holds names that leader in its order (not among the revoked);
- a (step, stage) that two such records name with different hashes is left out (a head that re-drove the steps
  after a rollback, or a lease head that lies): a state at that step is refused, never taken on either word.

Why Sybils cannot forge it: a peer id is free (5,000 Ed25519 keys in 0.3 s), but only the swarm key signs a
lease, and a lease's order is the coordinator's choice of heads, made while it was up (it survives the
coordinator: `held.py`); no headcount, id order or join order enters. A record from any other id fails the
lease check, however many ids sign the same hash, and a record's hash is what its head signed: a peer that
re-serves it cannot change a byte without breaking the signature. The heads are trusted exactly as far as the
coordinator trusts them, since it vouches for whatever hash a lease head signs; a lying lease head can at worst
make a (step, stage) read as not vouched (a joiner refuses and tries another donor or falls back), not make a
state it alone holds read as agreed while an honest head signed the agreed one.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from protocol.step_record import WorkRecord
from protocol.wire import WireError
from swarm.dht import LeaderLease, SwarmDHT
from swarm.trust.signed_records import signed_by_leader

log = logging.getLogger(__name__)


def lease_heads(lease: LeaderLease) -> list[str]:
    """The heads whose records count: the lease's order, less the heads it revoked."""
    return [h for h in lease.order if h not in lease.revoked]


def head_record(body: bytes, run_hash: str, n_stages: int, heads: set[str]) -> WorkRecord | None:
    """The work record in `body` if one of `heads` signed it for `run_hash` and it names hashes, else None."""
    try:
        record = WorkRecord.decode(body, run_hash, n_stages)
    except WireError:
        return None
    if record.leader not in heads or not signed_by_leader(record):
        return None
    if not (record.state_step > 0 and record.states) and not (record.snapshot_step > 0 and record.snapshots):
        return None
    return record


def keys_of(record: WorkRecord) -> list[tuple[str, str, int]]:
    """Where `HeldRecords.work` files the record: (head, "state" | "snapshot", step), one for each it names."""
    keys = [(record.leader, "state", record.state_step)] if record.state_step > 0 and record.states else []
    if record.snapshot_step > 0 and record.snapshots:
        keys.append((record.leader, "snapshot", record.snapshot_step))
    return keys


def agreed(records: list[WorkRecord], what: str) -> dict[int, dict[int, str]]:
    """step -> stage -> sha256 that the records name for `what` ("state" or "snapshot"); a (step, stage) named with
    two different hashes is left out."""
    named: dict[int, dict[int, set[str]]] = {}
    for r in records:
        step, hashes = (r.state_step, r.states) if what == "state" else (r.snapshot_step, r.snapshots)
        for stage, sha in hashes.items() if step > 0 else ():
            named.setdefault(step, {}).setdefault(stage, set()).add(sha)
    out = {t: {s: next(iter(h)) for s, h in stages.items() if len(h) == 1} for t, stages in named.items()}
    return {t: h for t, h in out.items() if h}


class HeadVouches:
    def __init__(self, sdht: SwarmDHT, run_hash: str, n_stages: int,
                 lease: Callable[[], Awaitable[LeaderLease | None]]) -> None:
        """`lease`: the newest lease the reader holds (`Router.lease`: the DHT's, else a held or a peer's copy)."""
        self.sdht, self.run_hash, self.n_stages, self.lease = sdht, run_hash, n_stages, lease
        # checked records by their bytes, for the lease (term, heads) they were checked under: a poll every half
        # second would otherwise verify every held signature again
        self._checked: dict[bytes, WorkRecord | None] = {}
        self._under: tuple[int, tuple[str, ...]] | None = None
        self._conflicts: set[tuple[str, int, int]] = set()  # logged once each

    async def records(self) -> list[WorkRecord]:
        """The lease heads' records this node holds or its peers serve (each checked); those read are held, and
        re-served."""
        lease = await self.lease()
        if lease is None:
            return []
        heads = lease_heads(lease)
        if self._under != (lease.term, tuple(heads)):
            self._under, self._checked = (lease.term, tuple(heads)), {}
        held = self.sdht.held
        peers = self.sdht.record_peers
        fetched = await peers.work(self.run_hash, heads, lambda b: self._check(b, heads) is not None) \
            if peers is not None else []
        bodies = dict.fromkeys([*(held.work_of(self.run_hash, max_bytes=1 << 30)), *fetched])
        found = [(b, r) for b in bodies if (r := self._check(b, heads)) is not None]
        held.keep_work(self.run_hash, {k: b for b, r in found for k in keys_of(r)})
        return [r for _, r in found]

    def _check(self, body: bytes, heads: list[str]) -> WorkRecord | None:
        if body not in self._checked:
            if len(self._checked) > 4096:  # bodies a peer sent that are gone again: start over
                self._checked = {}
            self._checked[body] = head_record(body, self.run_hash, self.n_stages, set(heads))
        return self._checked[body]

    async def hashes(self, stage: int, what: str = "state") -> dict[int, str]:
        """step -> the sha256 of `stage`'s state after that many steps (`what` "snapshot": of its snapshot at that
        step) that the lease's heads signed; {} if none."""
        records = await self.records()
        out = {t: h[stage] for t, h in agreed(records, what).items() if stage in h}
        for r in records:  # a conflict is a rollback's re-drive or a lying head: either way, say so once
            step, hashes = (r.state_step, r.states) if what == "state" else (r.snapshot_step, r.snapshots)
            if stage in hashes and step not in out and (what, step, stage) not in self._conflicts:
                self._conflicts.add((what, step, stage))
                log.warning("the lease's heads signed different %s hashes of stage %d at step %d: that step is read "
                            "as not vouched for", what, stage, step)
        return out

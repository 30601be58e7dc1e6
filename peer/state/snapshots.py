"""`SnapshotService`: consistent snapshots of every stage, held by peers of other stages, so that
a stage whose every replica died is restored rather than started afresh (issue 19).

Schedule: right after a replica applies a step that ends at a multiple of `every` (the stage
has applied S steps, S % every == 0), it serialises its stage's state on its worker thread (so
between two steps, as `peer/state/state_transfer.py` does) and keeps it: "its own last snapshots"
(`keep`, 2 by default). Every stage snapshots at the same step boundaries, so a rollback to S
needs no download.

Custody: the stage's live replica with the lowest peer id offers its snapshot (kind `snap`,
protocol/snapshot_wire.py) to `copies` peers of other stages, ranked by sha256(stage, peer id)
so that custody spreads over the swarm. A custodian takes an offer only from a peer announced
for the offered stage, fetches the snapshot in chunks from it, checks it against the offered
sha256 and keeps the newest `keep` per stage (`peer/state/snapshot_store.py`: memory is bounded by
the stage sizes). It fetches at a pace that leaves the holder's uplink mostly to training
(`CUSTODY_SHARE`).

Restore: a peer that takes a stage with no live replica asks every live peer which snapshots
of the stage it holds, and loads the newest step whose sha256 the most holders report, after
the checks a state download gets (`StagePeer._check_state`: run, stage, step, finite numbers,
the signed basis); the coordinator is asked too when it keeps snapshots on disk
(`swarm/replicas/checkpoint_keeper.py`). If it is older than the swarm's step the leader rolls every stage back to
it (`peer/state/rollback.py`). Step 0 needs no holder: every stage's state there is the one its replicas
build from the spec's seed, so a stage emptied before the swarm reached its first snapshot (step
`every`) is restored to step 0 and the swarm rolls back to the run's start (it loses fewer than
`every` steps, as any restore may). With no snapshot anywhere later, `restore` raises `NoSnapshot`:
the peer must not start the stage afresh unless its owner says so (`swarm join --allow-fresh-stage`).

What is trusted: the swarm key's word on which snapshot each stage took. The leading head learns
each stage's snapshot hash from its replicas' reduce replies (only when they all agree), signs
the hashes of a step at which every stage agreed into its work record, and the coordinator
vouches for them in the DHT (`swarm/replicas/vouched.py`); a restore loads only a vouched
(step, sha256), so colluding custodians cannot outvote the swarm. Until a hash is vouched for
(the run's first snapshot, or no coordinator), the majority of the custodians that answer
decides, as before.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable

import torch

from peer.daemon.daemon import StageDaemon
from peer.daemon.delivery import ACK
from peer.runner.stage import StageError, StageRunner
from protocol.model import build_stage
from protocol.snapshot_wire import (
    CHUNK_BYTES,
    MAX_LISTED,
    SnapshotInfo,
    SnapshotList,
    SnapshotRequest,
    decode_snapshot_list,
    decode_snapshot_request,
    encode_snapshot_list,
    encode_snapshot_request,
    n_chunks,
)
from protocol.wire import KIND_SNAPSHOT, WireError

from .snapshot_store import Snapshot, SnapshotRefused, SnapshotStore, sha256_hex
from .state_transfer import load_state_bytes, state_bytes

log = logging.getLogger(__name__)

CUSTODY_SHARE = 0.2  # the most of a holder's uplink a custodian's fetch of a snapshot takes
StateCheck = Callable[[dict, int], Awaitable[str | None]]  # (state, step) -> why it is refused, or None


class NoSnapshot(RuntimeError):
    """No live peer holds a usable snapshot of the stage; the text says what to do."""


@functools.lru_cache(maxsize=64)
def state_bound(spec, stage: int) -> int:
    """A generous bound on a stage's serialised state (weights, two moments, basis, slack),
    counted on the meta device: nothing is allocated. Kept per (spec, stage): building a stage's
    modules, even on the meta device, takes tens of ms, and every peer of a process (an in-memory
    swarm's, a coordinator's keeper) asks it of every stage (RunSpec is frozen, so hashable)."""
    with torch.device("meta"):
        n = sum(p.numel() for p in build_stage(spec, stage).parameters())
    return 4 * n * (8 if spec.dtype == "fp64" else 4) + (64 << 20)


class SnapshotService:
    def __init__(self, daemon: StageDaemon, *, every: int = 50, copies: int = 2, keep: int = 2,
                 chunk_bytes: int = CHUNK_BYTES, timeout: float = 120.0) -> None:
        self.daemon, self.runner, self.spec, self.stage = daemon, daemon.runner, daemon.spec, daemon.stage
        self.every, self.copies, self.chunk_bytes, self.timeout = every, copies, chunk_bytes, timeout
        self._bounds: dict[int, int] = {}
        self.store = SnapshotStore(self.max_bytes, keep)
        self._fetching: set[int] = set()  # stages whose offered snapshot this custodian is fetching now
        self.restored = False  # the state is a snapshot restored here, and no step was applied since
        # step -> the sha256 the swarm key vouches for, of this stage's snapshot (swarm/replicas/vouched.py;
        # None or {}: nobody vouches, and the restore takes the snapshot most custodians hold)
        self.vouched: Callable[[], Awaitable[dict[int, str]]] | None = None
        # holders asked besides the live peers: the coordinators, when they keep snapshots (--checkpoint-dir);
        # read at each restore, since which coordinator holds the seat changes (a standby takes over)
        self.extra_holders: Callable[[], Awaitable[list[str]]] | None = None

    @property
    def link(self):
        return self.daemon.link

    def max_bytes(self, stage: int) -> int:
        if stage not in self._bounds:
            self._bounds[stage] = state_bound(self.spec, stage)
        return self._bounds[stage]

    async def start(self) -> None:
        await self.link.serve(KIND_SNAPSHOT, self._on_request)

    # ------------------------------------------------------------------ taking and offering
    def after_step(self, step: int) -> None:
        """The stage applied its `step`-th step: at a snapshot boundary, take one (and offer it)."""
        self.restored = False
        if self.every > 0 and step > 0 and step % self.every == 0:
            self.daemon.spawn(self._take(step))

    def _serialise(self, step: int) -> Snapshot | None:
        """Worker thread: the state at the boundary, unless another step was applied first (queued
        at once, this runs before the next step's apply, so that does not happen in practice)."""
        if self.runner.step != step:
            return None
        data = state_bytes(self.runner.state_dict())
        return Snapshot(self.stage, step, sha256_hex(data), data)

    async def _take(self, step: int) -> None:
        snap = await self.daemon.run(self._serialise, step)
        if snap is None:
            log.warning("stage %d: the snapshot at step %d was missed (another step was applied first)",
                        self.stage, step)
            return
        self.store.put(snap)
        live = [p.peer_id for p in await self.daemon.directory.members(self.stage)]
        if min(live + [self.daemon.peer_id]) != self.daemon.peer_id:
            return  # another replica of the stage offers it
        custodians = await self.custodians()
        if not custodians:
            log.warning("stage %d: no peer of another stage is live to keep the snapshot at step %d", self.stage, step)
        body = encode_snapshot_request(SnapshotRequest(self.spec.run_hash, "offer", self.stage, step, 0, snap.sha256,
                                                       len(snap.data)))
        for peer in custodians:
            try:
                reply = await self.link.request(peer, KIND_SNAPSHOT, body, timeout=self.timeout)
                ok = reply == ACK
            except Exception as e:  # an unreachable custodian keeps nothing; the next snapshot tries again
                log.info("stage %d: %s took no snapshot (%s)", self.stage, peer[-8:], e)
                continue
            log.info("stage %d: snapshot at step %d (%.1f MB) offered to %s%s", self.stage, step,
                     len(snap.data) / 1e6, peer[-8:], "" if ok else ", which refused it")

    def newest_own(self) -> tuple[int, str] | None:
        """(step, sha256) of this stage's newest snapshot held here (taken here or restored), or None."""
        snap = self.store.newest(self.stage)
        return (snap.step, snap.sha256) if snap is not None else None

    async def custodians(self) -> list[str]:
        """The `copies` live peers of other stages that keep this stage's snapshots."""
        others = [p.peer_id for s in range(self.spec.n_stages) if s != self.stage
                  for p in await self.daemon.directory.members(s)]
        rank = {p: hashlib.sha256(f"{self.stage}:{p}".encode()).digest() for p in others}
        return sorted(set(others), key=rank.__getitem__)[:self.copies]

    # ------------------------------------------------------------------ serving
    async def _on_request(self, body: bytes, sender: str) -> bytes:
        d = self.daemon
        if (refusal := await d.admitted(sender, KIND_SNAPSHOT)) is not None:
            return refusal
        try:
            largest = max(self.max_bytes(s) for s in range(self.spec.n_stages))
            req = decode_snapshot_request(body, self.spec.run_hash, self.spec.n_stages, largest)
        except WireError as e:
            return d.refuse(str(e), sender)
        if req.op == "list":
            return encode_snapshot_list(self._listed(req.stage))
        if req.op == "chunk":
            snap = self.store.get(req.stage, req.step)
            if snap is None:
                return d.refuse("no snapshot of that stage and step is held here.", sender)
            if req.index >= n_chunks(len(snap.data), self.chunk_bytes):
                return d.refuse("the chunk index is past the end of the snapshot.", sender)
            return snap.data[req.index * self.chunk_bytes:(req.index + 1) * self.chunk_bytes]
        return await self._on_offer(req, sender)

    async def _on_offer(self, req: SnapshotRequest, sender: str) -> bytes:
        d = self.daemon
        if req.stage == self.stage:
            return d.refuse("a stage's replicas keep their own snapshots; offer it to a peer of another stage.", sender)
        if req.size > self.max_bytes(req.stage):
            return d.refuse(f"a snapshot of stage {req.stage} cannot be that large.", sender)
        if sender not in {p.peer_id for p in await d.directory.members(req.stage)}:
            return d.refuse(f"only a live replica of stage {req.stage} may offer its snapshot.", sender)
        if not self.store.wants(req.stage, req.step):
            return ACK  # held already, or older than what is held: nothing to fetch
        if req.stage in self._fetching:
            return d.refuse("a snapshot of that stage is being fetched here; offer it again later.", sender)
        self._fetching.add(req.stage)
        d.spawn(self._keep(req, sender))
        return ACK

    async def _keep(self, req: SnapshotRequest, sender: str) -> None:
        try:
            info = SnapshotInfo(req.step, req.sha256, req.size)
            data = await fetch_snapshot(self.link, sender, self.spec.run_hash, req.stage, info, self.chunk_bytes,
                                        self.timeout, share=CUSTODY_SHARE)
            self.store.put(Snapshot(req.stage, req.step, req.sha256, data))
            log.info("keeping stage %d's snapshot at step %d (%.1f MB) from %s", req.stage, req.step, len(data) / 1e6,
                     sender[-8:])
        except (NoSnapshot, SnapshotRefused) as e:
            log.warning("stage %d's snapshot at step %d from %s is not kept: %s", req.stage, req.step, sender[-8:], e)
        finally:
            self._fetching.discard(req.stage)

    # ------------------------------------------------------------------ asking others
    async def survey(self, asked: dict[str, int]) -> dict[str, SnapshotList]:
        """Ask each peer (-> the stage asked about) what it holds of that stage, and its own step;
        this peer answers from its own store. Peers that fail to answer are left out."""
        async def ask(peer: str, stage: int) -> SnapshotList | None:
            if peer == self.daemon.peer_id:
                return self._listed(stage)
            body = encode_snapshot_request(SnapshotRequest(self.spec.run_hash, "list", stage))
            try:
                reply = await self.link.request(peer, KIND_SNAPSHOT, body, timeout=min(self.timeout, 30.0))
                return decode_snapshot_list(reply, self.max_bytes(stage))
            except Exception as e:  # a peer that does not answer holds nothing usable
                log.info("%s did not say which snapshots it holds (%s)", peer[-8:], e)
                return None
        replies = await asyncio.gather(*(ask(p, s) for p, s in asked.items()))
        return {p: r for p, r in zip(asked, replies) if r is not None}

    def _listed(self, stage: int) -> SnapshotList:
        return SnapshotList(self.runner.step, self.store.listed(stage)[:MAX_LISTED],
                            self.restored and stage == self.stage)

    async def restore(self, check: StateCheck, step: int | None = None, swarm_step: int | None = None) -> int:
        """Load this stage's newest snapshot held by a live peer (or the one at `step`); returns its step.
        Step 0's is the stage's initial state, which any peer builds from the spec's seed: asked for it (a
        rollback to the run's start), or finding no snapshot while the swarm is younger than its second one (its
        first may not have reached a custodian), it loads that. `swarm_step`: the swarm's step as the caller knows it
        (the swarm key's records, or the leading head's command); the highest step a surveyed peer reports counts
        if higher."""
        if step == 0:
            return await self._restore_initial(check)
        asked = {p.peer_id: self.stage for s in range(self.spec.n_stages)
                 for p in await self.daemon.directory.members(s) if p.peer_id != self.daemon.peer_id}
        asked.update({p: self.stage for p in (await self.extra_holders() if self.extra_holders is not None else [])
                      if p != self.daemon.peer_id})
        vouched = await self.vouched() if self.vouched is not None else {}
        holders: dict[SnapshotInfo, list[str]] = {}
        surveyed = await self.survey(asked)
        for peer, listed in sorted(surveyed.items()):
            for info in listed.held:
                if vouched and vouched.get(info.step) != info.sha256:
                    continue  # not the snapshot the swarm took (or one not vouched for yet): not loaded
                if step is None or info.step == step:
                    holders.setdefault(info, []).append(peer)
        if not vouched:
            log.info("stage %d: no snapshot hash is vouched for yet; taking the one most custodians hold", self.stage)
        for s in sorted({i.step for i in holders}, reverse=True):
            versions = sorted((i for i in holders if i.step == s), key=lambda i: -len(holders[i]))
            if len(versions) > 1:
                log.warning("stage %d: custodians disagree on its snapshot at step %d; trying the one most hold first",
                            self.stage, s)
            for info in versions:
                for peer in holders[info]:
                    try:
                        await self._load_from(peer, info, check)
                    except (NoSnapshot, SnapshotRefused, StageError) as e:
                        log.warning("stage %d: the snapshot at step %d from %s is refused: %s", self.stage, s,
                                    peer[-8:], e)
                        continue
                    log.info("stage %d: restored from the snapshot at step %d held by %s", self.stage, s, peer[-8:])
                    self.restored = True
                    return s
        # the surveyed peers' own steps are read now (announcements may lag): the higher of the two counts
        swarm_step = max([lst.step for lst in surveyed.values()] + [self.runner.step, swarm_step or 0])
        # custodians keep the two newest snapshots, so a stage emptied before its newest reached them restores
        # the one before; before the second snapshot step, the one before the first is step 0's
        if step is None and 0 < self.every and swarm_step < 2 * self.every:
            log.warning("stage %d: no live peer holds a snapshot of it (the swarm is at step %d; its first snapshot, "
                        "at step %d, had not reached a custodian): it starts from its initial state, step 0's, and "
                        "the swarm rolls back to it", self.stage, swarm_step, self.every)
            return await self._restore_initial(check)
        at = "" if step is None else f" at step {step}"
        raise NoSnapshot(f"no live peer holds a usable snapshot of stage {self.stage}{at}: the swarm stays paused "
                         f"until one does (or a peer joins with --allow-fresh-stage to start the stage afresh).")

    async def _restore_initial(self, check: StateCheck | None) -> int:
        """Make the stage's state at step 0 (built from the spec's seed, as every replica builds it) its state."""
        state = await asyncio.to_thread(lambda: StageRunner(self.spec, self.stage).state_dict())
        problem = await check(state, 0) if check is not None else None
        if problem:
            raise SnapshotRefused(f"the stage's initial state is refused: {problem}")
        await self.daemon.run(self.runner.load_state_dict, state)
        self.daemon.stepped()
        self.restored = True
        log.info("stage %d: restored its initial state (step 0's)", self.stage)
        return 0

    async def _load_from(self, peer: str, info: SnapshotInfo, check: StateCheck) -> None:
        data = await fetch_snapshot(self.link, peer, self.spec.run_hash, self.stage, info, self.chunk_bytes,
                                    self.timeout)
        await self.load(Snapshot(self.stage, info.step, info.sha256, data), check)

    async def load(self, snap: Snapshot, check: StateCheck | None) -> None:
        """Make `snap` this stage's state (and keep it as this replica's own snapshot)."""
        try:
            state = load_state_bytes(snap.data)
        except Exception as e:  # bytes torch cannot load safely are refused, whatever the reason
            raise SnapshotRefused(f"it cannot be loaded safely ({type(e).__name__}).") from e
        problem = await check(state, snap.step) if check is not None else None
        if problem:
            raise SnapshotRefused(problem)
        await self.daemon.run(self.runner.load_state_dict, state)
        self.daemon.stepped()
        self.store.put(snap)


async def fetch_snapshot(link, peer: str, run: str, stage: int, info: SnapshotInfo, chunk_bytes: int,
                         timeout: float, share: float = 1.0) -> bytes:
    """Stage `stage`'s snapshot `info` from `peer`, in chunks, checked against its size and sha256.

    With `share` < 1 the fetch paces itself: after a chunk that took t seconds it waits
    t (1/share - 1), so that it takes at most about `share` of the holder's uplink, which carries
    the swarm's activations and gradients too. A restore (the swarm is paused) takes it all."""
    parts = []
    try:
        for i in range(n_chunks(info.size, chunk_bytes)):
            body = encode_snapshot_request(SnapshotRequest(run, "chunk", stage, info.step, i))
            t0 = time.monotonic()
            part = await link.request(peer, KIND_SNAPSHOT, body, timeout=timeout)
            if len(part) > chunk_bytes:
                raise NoSnapshot(f"{peer[-8:]} sent a chunk larger than a chunk.")
            parts.append(part)
            if share < 1.0:
                await asyncio.sleep((time.monotonic() - t0) * (1.0 / share - 1.0))  # pacing, not waiting on a condition
    except NoSnapshot:
        raise
    except Exception as e:  # transport failures of any kind
        raise NoSnapshot(f"could not fetch the snapshot from {peer[-8:]} ({e}).") from e
    data = b"".join(parts)
    if len(data) != info.size or sha256_hex(data) != info.sha256:
        raise SnapshotRefused(f"the snapshot from {peer[-8:]} does not match its size or sha256.")
    return data

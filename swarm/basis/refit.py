"""`BasisRefitter`: the coordinator's side of the Grassmann basis updates (docs/algorithms.md 1.7).

At every re-fit step the receiving stages send their statistic (EMA of C_s U). Replicas of a
stage hold the same statistic (they are summed in the replicas' all-reduce; one that joined by
download was seen to differ in the last bits, ~1e-12 relative), so the refitter takes a
stage's statistic only once a quorum agrees on it: more than half of the stage's live
replicas, equal to within a relative 1e-6 (`STAT_RTOL`); one replica, lying or not, cannot
outvote the others. A replica counts only if it answers a liveness probe (a killed one's record
lives on for its ttl), and while statistics wait for a quorum it is looked for again every 2 s:
a replica that died after the others sent theirs no longer loses the re-fit. Once
every stage 1..n-1 has a quorum for (basis version v, step t), it takes one capped Grassmann
step from U_v, signs (run, v+1, t + switch delay, U_{v+1}) with the swarm key, stores it in
the DHT (where late joiners and peers that missed the push find it) and pushes it to every
announced peer.

Who votes (issue 20, item 5): with a lease, only the peers that the leading head's signed work
record of that re-fit step names as having contributed microbatches to its reduce
(`protocol/step_record.py`, sent by a head the lease names), and of those only the ones that
answer; announcing a stage earns no vote, so 40 fake ids weigh nothing, and the swarm's step is
the one the leader recorded, so a stranger's announced step moves no window.

What it accepts is bounded: statistics only from peers announced for the stage they name,
only for re-fit steps after the last published one and at most ten intervals past the
swarm's announced step (announcements lag behind), at most one per peer (a newer one replaces
it); so it holds at most one d x k matrix per live replica, and no message can schedule a
switch at a far step (the effective step is always the coordinator's t + delay).
Statistics tagged with an older version than the last published one mean that update was not
taken up (it arrived too late); the refitter then starts again from the version the stages
are really on.

A coordinator that restarts, or a standby that takes over with the same swarm key, calls
`resume()` before it serves: it reads the signed updates back from the DHT (each checked against
the spec's coordinator key, and only an unbroken chain 1..V), so that it knows every U_v the
stages may tag a statistic with, republishes the whole chain for late joiners, and signs its next
re-fit as version V+1 from U_V, the same bits as if it had never stopped.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Awaitable, Callable

import torch

from protocol.basis_update import BasisUpdate, canonical_basis, decode_stats, decode_update, encode_update, next_basis
from protocol.model import compute_dtype, spec_basis
from protocol.spec import RunSpec
from protocol.step_record import WorkRecord
from protocol.wire import KIND_BASIS, ErrorReply, WireError, encode_message
from swarm.dht import SwarmDHT
from swarm.dht.record_share import PeerRecords
from swarm.net.transport import Transport
from swarm.trust.keys import SigningKey, verify
from swarm.trust.signed_records import signed_by_leader

log = logging.getLogger(__name__)

LIVE = ("online", "paused")
STAT_RTOL = 1e-6  # statistics of one stage closer than this (relative, Frobenius) are one vote
RECHECK_S = 2.0  # while statistics wait for a quorum, how often it is looked for again
RECHECK_FOR_S = 120.0  # and for how long
STEP_WINDOW_INTERVALS = 10  # how far past the swarm's known step a re-fit step may be (announcements lag)
WORK_RECORDS_KEPT = 4  # the latest re-fit steps whose work records are held


def _agree(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float(torch.linalg.norm(a.double() - b.double())) <= STAT_RTOL * float(torch.linalg.norm(a.double()))


def _signed_update(body: bytes, version: int, spec: RunSpec, public: bytes) -> bool:
    """Whether `body` is the signed update of `version` under the key `public` (a peer's copy of the chain)."""
    try:
        update = decode_update(body, spec)
    except WireError:
        return False
    return update.version == version and verify(public, update.signing_bytes(), update.signature)


def _refuse(reason: str) -> bytes:
    return encode_message(ErrorReply(reason))


class BasisRefitter:
    def __init__(self, spec: RunSpec, key: SigningKey, sdht: SwarmDHT, transport: Transport, ttl: float,
                 answers: Callable[[str], Awaitable[bool]] | None = None,
                 recheck_s: float = RECHECK_S, leaders: Callable[[], list[str]] | None = None) -> None:
        self.spec, self.key, self.sdht, self.transport, self.ttl = spec, key, sdht, transport, ttl
        self.answers = answers  # peer -> whether it answers a liveness probe (None: every announced one counts)
        self.recheck_s = recheck_s
        # the heads the swarm key's lease names: their signed work records say who may vote in a re-fit
        # (None: every live announced replica votes; only the quorum's own tests run without a lease)
        self.leaders = leaders
        self._workers: dict[int, dict[int, set[str]]] = {}  # re-fit step -> stage -> peers that worked it
        self.on_record: Callable[[WorkRecord], Awaitable[object]] | None = None  # every verified work record
        self._rechecks: dict[tuple[int, int], asyncio.Task] = {}
        # the loop holds a task only weakly: one awaiting the DHT's reply could be collected mid-publish (seen:
        # version 1 reached the DHT, but its log line and its push never came)
        self._refits: set[asyncio.Task] = set()
        basis = spec_basis(spec)
        self.bases: dict[int, torch.Tensor] = {0: basis.U} if basis is not None else {}
        # (basis version, re-fit step) -> stage -> peer -> (hash of M, M); at most one entry per peer
        self._stats: dict[tuple[int, int], dict[int, dict[str, tuple[str, torch.Tensor]]]] = {}
        self._pending: dict[str, tuple[int, int]] = {}  # peer -> the key of its statistic held here
        self.last_refit = 0  # the re-fit step of the last published update
        self.published: list[BasisUpdate] = []
        self.refused = 0
        self.dropped = 0  # statistics a re-fit left out (outside the agreeing majority)
        self._lock = asyncio.Lock()

    async def on_stats(self, body: bytes, sender: str) -> bytes:
        try:
            msg = decode_stats(body, self.spec)
        except WireError as e:
            return self._refused(str(e))
        if msg.basis_version not in self.bases:
            return self._refused(f"basis version {msg.basis_version} is unknown to the coordinator.")
        if msg.step % self.spec.basis_interval or msg.step <= 0:
            return self._refused("the statistic is not for a re-fit step.")
        live = await self._replicas(msg.stage)
        if sender not in live:
            return self._refused(f"only peers announced for stage {msg.stage} may send its statistic.")
        # the swarm's step as the lease's leader recorded it (a stranger's announced step moves nothing),
        # else as announced
        known = max(self._workers, default=0) if self.leaders is not None else max(live.values(), default=0)
        horizon = known + STEP_WINDOW_INTERVALS * self.spec.basis_interval
        if msg.step <= self.last_refit or msg.step > horizon:
            return self._refused("the statistic is not for a re-fit step being collected.")
        key = (msg.basis_version, msg.step)
        old = self._pending.get(sender)
        if old == key:
            return self._refused("this peer's statistic for this re-fit is already here.")
        if old is not None:  # one statistic per peer is kept: its newer one replaces it
            self._stats.get(old, {}).get(msg.stage, {}).pop(sender, None)
        self._pending[sender] = key
        self._stats.setdefault(key, {}).setdefault(msg.stage, {})[sender] = (
            hashlib.sha256(msg.M.numpy().tobytes()).hexdigest(), msg.M)
        if not await self._try_refit(key) and key not in self._rechecks:
            self._rechecks[key] = asyncio.get_running_loop().create_task(self._recheck(key))
        return b""

    async def on_work(self, body: bytes, sender: str) -> bytes:
        """A leading head's signed record of who worked a re-fit step, and of the snapshots every stage
        took (protocol/step_record.py): checked here, for both."""
        try:
            record = WorkRecord.decode(body, self.spec.run_hash, self.spec.n_stages)
        except WireError as e:
            return self._refused(str(e))
        if self.leaders is None or record.leader != sender or sender not in self.leaders():
            return self._refused("only a head that the swarm key's lease names sends work records.")
        if not signed_by_leader(record):
            return self._refused("the work record is not signed by the head it names.")
        if self.on_record is not None:
            await self.on_record(record)  # its snapshot hashes (swarm/replicas/vouched.py)
        if (self.spec.codec != "subspace" or record.step % self.spec.basis_interval or record.step <= self.last_refit
                or not record.workers):
            return b""  # not a re-fit step being collected (or a record of state hashes only): nothing to do
        self._workers[record.step] = {s: set(p) for s, p in record.workers.items()}
        for step in sorted(self._workers)[:-WORK_RECORDS_KEPT]:
            del self._workers[step]
        for key in [k for k in self._stats if k[1] == record.step]:
            await self._try_refit(key)
        return b""

    async def _try_refit(self, key: tuple[int, int]) -> bool:
        """Re-fit from (version, step)'s statistics if every receiving stage has a quorum; True if
        that re-fit is done or started (here or before)."""
        version, step = key
        if step <= self.last_refit:
            return True
        agreed = {s: self._quorum(key, s, await self._voters(s, step)) for s in range(1, self.spec.n_stages)}
        if step <= self.last_refit:  # started meanwhile, by a statistic or a re-check
            return True
        if any(M is None for M in agreed.values()):
            return False
        self.last_refit = step
        self._log_dropped(key, agreed)
        for k in [k for k in self._stats if k[1] <= step]:
            del self._stats[k]
        self._pending = {p: k for p, k in self._pending.items() if k in self._stats}
        task = asyncio.get_running_loop().create_task(self._refit(version, step, agreed))
        self._refits.add(task)
        task.add_done_callback(self._refits.discard)
        return True

    def _log_dropped(self, key: tuple[int, int], agreed: dict[int, torch.Tensor]) -> None:
        """Name every statistic the re-fit left out, with how far it is from the agreed one."""
        for stage, M in agreed.items():
            for peer, (_, other) in sorted(self._stats.get(key, {}).get(stage, {}).items()):
                if not _agree(M, other):
                    a, b = M.double().flatten(), other.double().flatten()
                    cos = float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))
                    self.dropped += 1
                    log.warning("re-fit at step %d: dropped stage %d's statistic from %s (norm %.3g x the agreed "
                                "one's, angle %.1f deg)", key[1], stage, peer[-8:],
                                float(b.norm() / a.norm().clamp_min(1e-300)),
                                math.degrees(math.acos(max(-1.0, min(1.0, cos)))))

    async def _recheck(self, key: tuple[int, int]) -> None:
        """A replica that died after the others sent their statistic still counts until its record
        expires or it fails a probe, and no statistic may come to look again: so look again."""
        try:
            for _ in range(int(RECHECK_FOR_S / self.recheck_s)):
                await asyncio.sleep(self.recheck_s)  # the re-check schedule
                if key not in self._stats or await self._try_refit(key):
                    return
        finally:
            self._rechecks.pop(key, None)

    def stop(self) -> None:
        for task in [*self._rechecks.values(), *self._refits]:
            task.cancel()

    async def _voters(self, stage: int, step: int) -> list[str]:
        """The replicas of `stage` a quorum counts: announced live, and answering a probe if there is one;
        with a lease, only those the leader's work record of `step` names (none until it is here)."""
        live = sorted(await self._replicas(stage))
        if self.leaders is not None:
            worked = self._workers.get(step, {}).get(stage, set())
            live = [p for p in live if p in worked]
        if self.answers is None or not live:
            return live
        return [p for p, ok in zip(live, await asyncio.gather(*map(self.answers, live))) if ok]

    def _refused(self, reason: str) -> bytes:
        self.refused += 1
        log.warning("refused a statistic: %s", reason)
        return _refuse(reason)

    async def _replicas(self, stage: int) -> dict[str, int]:
        """The live replicas of `stage` and the step each announces."""
        return {a.peer_id: a.step for a in await self.sdht.stage_peers(self.spec.run_hash, stage) if a.state in LIVE}

    def _quorum(self, key: tuple[int, int], stage: int, voters: list[str]) -> torch.Tensor | None:
        """The statistic more than half of the stage's live replicas agree on, if any: two agree
        when ||A - B||_F <= STAT_RTOL ||A||_F (replicas sum the same numbers, but a replica that
        joined by download can differ in the last bits; a lie differs by far more). The group's
        statistic from the lowest peer id is the one used, so the choice is the same every time."""
        got = {p: v for p, v in self._stats.get(key, {}).get(stage, {}).items() if p in voters}
        n_live = len(voters)
        groups: list[list[torch.Tensor]] = []
        for _, (_, M) in sorted(got.items()):
            group = next((g for g in groups if _agree(g[0], M)), None)
            if group is None:
                groups.append([M])
            else:
                group.append(M)
        best = max(groups, key=len, default=[])  # of equal groups, the first: its lowest id came first
        if len(best) * 2 <= max(n_live, 1):
            return None
        return best[0]

    async def _refit(self, version: int, step: int, stats: dict[int, torch.Tensor]) -> None:
        async with self._lock:
            U = next_basis(self.bases[version], [stats[s] for s in sorted(stats)], self.spec)
            update = BasisUpdate(self.spec.run_hash, version + 1, step + self.spec.basis_switch_delay, U)
            update.signature = self.key.sign(update.signing_bytes())
            for v in [v for v in self.bases if v > version]:
                del self.bases[v]  # a later version that the stages never took up is abandoned
            self.bases[version + 1] = canonical_basis(U, compute_dtype(self.spec))
            # and no longer republished: its entry in the DHT is replaced (same version) or expires
            self.published = [u for u in self.published if u.version <= version] + [update]
            body = encode_update(update)
            await self.sdht.publish_basis(self.spec.run_hash, update.version, body, self.ttl)
            log.info("basis version %d published, effective at step %d", update.version, update.effective_step)
        await self._push(body)

    async def _push(self, body: bytes) -> None:
        peers = await self.sdht.all_stage_peers(self.spec.run_hash, self.spec.n_stages)
        ids = [a.peer_id for anns in peers.values() for a in anns if a.state == "online"]
        results = await asyncio.gather(*(self.transport.request(p, KIND_BASIS, body, timeout=10) for p in ids),
                                       return_exceptions=True)
        for peer, res in zip(ids, results):
            if isinstance(res, Exception) or res != b"":
                log.warning("push of a basis update to %s failed (%s); it will fetch it from the DHT",
                            peer[-8:], res if isinstance(res, Exception) else "refused")

    async def republish(self) -> None:
        """Keep every published update alive in the DHT (late joiners need the whole chain)."""
        for update in self.published:
            await self.sdht.publish_basis(self.spec.run_hash, update.version, encode_update(update), self.ttl)

    async def resume(self, peers: PeerRecords | None = None) -> int:
        """Take up the chain of updates this swarm key already published (a restarted coordinator, or a standby
        with the same key); returns the newest version resumed (0: none). Call it before serving.

        Resumed: `bases` (U_v of every version, as `_refit` keeps it, so that a statistic tagged v > 0 is taken
        and the next re-fit steps from the basis the stages are on), `published` (what `republish` keeps alive
        for late joiners) and `last_refit` (the newest update's re-fit step: its effective step minus the switch
        delay; no statistic of an older re-fit step is collected again). An entry that does not decode, names
        another version than its own, or whose signature is not the spec's coordinator key's is skipped with a
        warning; the chain is 1, 2, ... up to the first version missing or skipped, and also stops where an
        effective step does not come after the one before (a version a later re-fit abandoned, left in the DHT
        until its ttl ends). A DHT failure is raised: resuming nothing would restart the chain at version 1. With
        none in the DHT (every coordinator was down longer than the chain lives there), `peers` are asked for the
        chain they hold (swarm/dht/record_share.py), checked the same way."""
        if not self.bases:
            return 0  # no subspace basis in this run: nothing to resume
        public = bytes.fromhex(self.spec.coordinator_key) if self.spec.coordinator_key else self.key.public_bytes()
        stored = await self.sdht.fetch_bases(self.spec.run_hash, public)
        if not stored and peers is not None:
            stored = await peers.bases(self.spec.run_hash, lambda v, body: _signed_update(body, v, self.spec, public))
        chain: list[BasisUpdate] = []
        for version in sorted(v for v in stored if v > 0):
            try:
                update = decode_update(stored[version], self.spec)
            except WireError as e:
                log.warning("resume: skipped the stored basis update %d: %s", version, e)
                continue
            if update.version != version or not verify(public, update.signing_bytes(), update.signature):
                log.warning("resume: skipped the stored basis update %d: not the coordinator key's signed update "
                            "of that version", version)
                continue
            if version != len(chain) + 1 or (chain and update.effective_step <= chain[-1].effective_step):
                log.warning("resume: the chain of basis updates stops at version %d (update %d %s)", len(chain),
                            version, "follows a gap" if version != len(chain) + 1 else "is an abandoned one")
                break
            chain.append(update)
        async with self._lock:
            dtype = compute_dtype(self.spec)
            self.bases = {0: self.bases[0], **{u.version: canonical_basis(u.U, dtype) for u in chain}}
            self.published = chain
            self.last_refit = chain[-1].effective_step - self.spec.basis_switch_delay if chain else 0
            self._stats = {k: v for k, v in self._stats.items() if k[0] in self.bases and k[1] > self.last_refit}
            self._pending = {p: k for p, k in self._pending.items() if k in self._stats}
        if chain:
            log.info("resumed basis versions 1-%d from the DHT (last re-fit at step %d)", len(chain), self.last_refit)
        return len(chain)

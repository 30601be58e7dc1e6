"""`CoordinatorDuties`: what the coordinator that holds the seat does for the swarm, started when it takes the
seat and stopped when it loses it (`seat.py`).

The duties, each signed with the swarm key: keep the run spec published; grant the leader lease
(`LeaseKeeper`) and revoke a head whose data report holds, or a reporting head whose does not (`DataVerdict`), or a
head proven to have refused a genuine step record (`RefusalVerdict`); vouch for the snapshot and state
hashes the leading head records (`SnapshotVouch`); re-fit the basis (`BasisRefitter`); with
--checkpoint-dir, keep the vouched snapshots (`CheckpointKeeper`). Each resumes from the DHT where the last
holder left it (a restarted coordinator, or a standby that took over): the lease's order, term and
revocations, the basis versions, the vouched hashes (the lease and the basis chain from the peers, where every
coordinator was down longer than they live there: swarm/dht/record_share.py). Nothing is re-issued out of order,
and none of them can sign once the seat is lost (`SwarmDHT.seat_fence`). `--record-ttl` shortens the life of every
record they sign.

The message handlers (`serve`) are registered once per process; a coordinator standing by refuses what only
the seat's holder does, so that a peer that asked the wrong one reads the claims again and asks the holder.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from peer.data.run_corpus import run_batches
from peer.data.run_tokens import token_batches
from protocol.spec import RunSpec
from protocol.wire import (
    KIND_DATA_REPORT,
    KIND_REFUSAL_REPORT,
    KIND_SNAPSHOT,
    KIND_STATS,
    KIND_WORK,
    ErrorReply,
    encode_message,
)
from swarm.basis import BasisRefitter
from swarm.dht import SwarmDHT
from swarm.dht.swarm_records import SeatLost
from swarm.monitor.liveness import LivenessProbe
from swarm.net import Transport
from swarm.replicas.checkpoint_keeper import CheckpointKeeper
from swarm.replicas.data_check import DataVerdict, tell_to_read_lease
from swarm.replicas.leases import LeaseKeeper
from swarm.replicas.refusal_verdict import RefusalVerdict
from swarm.replicas.vouched import SnapshotVouch
from swarm.trust.keys import SigningKey

from .options import CoordinatorOptions

log = logging.getLogger(__name__)

STANDING_BY = encode_message(ErrorReply("this coordinator stands by: the swarm's active coordinator is the one whose "
                                        "claim holds the seat (read the coordinator claims again).", code="standby"))


class CoordinatorDuties:
    def __init__(self, opts: CoordinatorOptions, spec: RunSpec, key: SigningKey, sdht: SwarmDHT,
                 transport: Transport, p2p, on_refitter: Callable[[BasisRefitter], None] | None = None) -> None:
        self.opts, self.spec, self.key, self.sdht, self.transport = opts, spec, key, sdht, transport
        self.probe = LivenessProbe(p2p).checker(spec.run_hash, transport)  # a killed peer's record outlives it
        self.on_refitter = on_refitter
        self.keeper: LeaseKeeper | None = None
        self.refitter: BasisRefitter | None = None
        self.vouch: SnapshotVouch | None = None
        self.verdict: DataVerdict | None = None
        self.refusals: RefusalVerdict | None = None
        self.snapshots: CheckpointKeeper | None = None
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ handlers (registered once)
    async def serve(self) -> None:
        async def only_holder(body: bytes, sender: str, pick: Callable[[], Callable[..., Awaitable[bytes]] | None]):
            handler = pick()
            return STANDING_BY if handler is None else await handler(body, sender)
        kinds = {KIND_WORK: lambda: self.refitter and self.refitter.on_work,  # who re-fits; which snapshots are sound
                 KIND_DATA_REPORT: lambda: self.verdict and self.verdict.on_report,  # leaders that fed other data
                 KIND_REFUSAL_REPORT: lambda: self.refusals and self.refusals.on_report}  # heads that refused one
        if self.spec.refits_basis:
            kinds[KIND_STATS] = lambda: self.refitter and self.refitter.on_stats
        if self.opts.checkpoint_dir:  # the coordinator holds every stage's vouched snapshots too (issue 19)
            kinds[KIND_SNAPSHOT] = lambda: self.snapshots and self.snapshots.on_request
        for kind, pick in kinds.items():
            await self.transport.serve(kind, lambda body, sender, pick=pick: only_holder(body, sender, pick))

    # ------------------------------------------------------------------ the seat's duties
    async def start(self) -> None:
        """Take up every duty, each resumed from the DHT, and publish the run spec."""
        spec, sdht, opts = self.spec, self.sdht, self.opts
        short = opts.record_ttl  # --record-ttl: every record lives that long, republished every third of it
        keeper = LeaseKeeper(sdht, spec.run_hash, self.probe, trusted=opts.trusted_heads,
                             **({"ttl": short, "republish_s": min(30.0, short / 3)} if short else {}))
        refitter = BasisRefitter(spec, self.key, sdht, self.transport, short or opts.ttl * 100, answers=self.probe,
                                 leaders=lambda: keeper.lease.order if keeper.lease is not None else [])
        vouch = SnapshotVouch(sdht, spec.run_hash, spec.n_stages, **({"ttl": short} if short else {}))
        await refitter.resume(sdht.record_peers)
        await vouch.resume()
        await keeper.load()  # the lease's heads, before a work record comes (a leader's kept ones come at once)

        async def on_record(record) -> None:  # a lease head's signed work record: its hashes, and who worked
            keeper.note_work(record)
            await vouch.on_record(record)
        refitter.on_record = on_record
        if self.on_refitter is not None:
            self.on_refitter(refitter)
        if opts.checkpoint_dir:
            async def holders(stage: int) -> list[str]:  # the stage's own replicas first, then its custodians
                found = await sdht.all_stage_peers(spec.run_hash, spec.n_stages)
                return list(dict.fromkeys(a.peer_id for s in [stage] + [t for t in found if t != stage]
                                          for a in found.get(s, [])))
            self.snapshots = CheckpointKeeper(spec, self.transport, holders, opts.checkpoint_dir)
            vouch.on_vouched = self.snapshots.on_vouched

        async def everyone_reads(_lease) -> None:  # after a revocation: every peer reads the new lease now
            peers = [a.peer_id for anns in (await sdht.all_stage_peers(spec.run_hash, spec.n_stages)).values()
                     for a in anns]
            await tell_to_read_lease(self.transport, spec.run_hash, peers)
        keeper.on_revoke = everyone_reads

        async def revoke(head: str, why: str, to: int | None, caught: int) -> bool:
            if to is not None:  # the undone steps' vouched snapshots and states go: they are driven again
                await vouch.forget_after(to)
            return await keeper.revoke(head, why, to, caught)

        async def heads() -> set[str]:  # a head that joined a moment ago is not in the lease yet
            return {a.peer_id for a in await sdht.stage_peers(spec.run_hash, 0)} | set(keeper.lease.order
                                                                                     if keeper.lease else [])
        self.verdict = DataVerdict(spec.run_hash, spec.n_microbatches, lambda: token_batches(spec, opts.tokens)
                                   or run_batches(spec, opts.data), revoke,
                                   lambda head, caught: vouch.before(head, caught, keeper.revoked), heads=heads)
        self.refusals = RefusalVerdict(self.verdict)
        self.keeper, self.refitter, self.vouch = keeper, refitter, vouch
        sdht.held.spec = await sdht.publish_run_spec(spec.to_json(), self.key, self._spec_ttl)  # re-served too
        self._tasks = [asyncio.create_task(keeper.run()), asyncio.create_task(self._republish())]

    async def _republish(self) -> None:
        """Keep the run spec, the basis chain and the vouched hashes alive in the DHT."""
        while True:
            await asyncio.sleep(self._spec_ttl / 3)
            try:
                await self.sdht.publish_run_spec(self.spec.to_json(), self.key, self._spec_ttl)
                await self.refitter.republish()
                await self.vouch.republish()
            except SeatLost:
                return  # the seat's watch stops the duties
            except Exception as e:  # keep coordinating; the next round retries
                log.warning("could not re-publish the run spec: %s", e)

    @property
    def _spec_ttl(self) -> float:
        return self.opts.record_ttl or self.opts.ttl

    async def stop(self) -> None:
        """Drop every duty (the seat is lost or the coordinator stops); handlers then answer STANDING_BY."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.refitter is not None:
            self.refitter.stop()
        if self.snapshots is not None:
            await self.snapshots.stop()
        self.keeper = self.refitter = self.vouch = self.verdict = self.refusals = self.snapshots = None

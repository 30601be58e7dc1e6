"""`Membership`: who may send what to this stage, from the signed stage announcements.

Each kind of message may come only from peers that are announced (and, in a private swarm,
admitted with a ticket) for the stage it belongs to:

    act          peers of the previous stage; at stage 1, only the leading head and the heads it named
                 for the step in progress (`named`, peer/commit/head_work.py;
                 the attempt is checked in peer/daemon/inbound.py)
    grad         peers of the next stage
    ctl          status: any admitted peer (a liveness probe, a dashboard); reduce, apply, abort:
                 only the leading head
    red          replicas of this stage             fol    peers of this stage (the donor)
    state        any admitted peer: a joining replica, or `swarm export` (the model is the swarm's)
    snap         any admitted peer (listing and fetching snapshots: the model is the swarm's); an
                 offer is taken only from a live replica of the offered stage (peer/state/snapshots.py)
    basis        anyone: the update itself is signed by the swarm key

The leading head is the one the heads themselves follow (`peer/step/leadership.py`, computed here over
the live heads this peer sees and the swarm key's lease: the first live head of its order). So
a peer that merely announces itself as a head, or one that the lease does not name, cannot feed
stage 1 microbatches of its own, nor abort or commit the leader's steps. When a head that
claims the lead sends what only the leader may send while this peer still follows another, this
peer probes that other head itself (a status request, at most once per `probe_s`): only if it
does not answer is it set aside, until it announces again, and the claimant followed. A dead
leader's successor is so followed within seconds, and no head's word that the leader died is
taken on trust.

and never from a peer this process banned for sending bad data, or for the run (`Router.refuses`); a
peer it only avoids for failing (it did not answer in time) is still heard. Announcements are read
through the router's 2 s cache; a sender not found there causes one fresh read of that
stage, at most once a second, so a newcomer is admitted within a second while a stranger
cannot make this peer hammer the DHT.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from peer.daemon.interfaces import PeerInfo, Refusal
from peer.step.leadership import leader_of
from protocol.wire import (
    KIND_ACTIVATION,
    KIND_BASIS,
    KIND_CONTROL,
    KIND_DRIVE,
    KIND_FOLLOW,
    KIND_GRADIENT,
    KIND_REDUCE,
    KIND_SNAPSHOT,
    KIND_STATE,
)
from swarm.dht import SwarmDHT

from .router import LIVE_STATES, Router

REFRESH_S = 1.0
PROBE_S = 2.0  # the least time between two probes of one head, and how long a probe waits for its answer


class Membership:
    def __init__(self, router: Router, sdht: SwarmDHT, stage: int, n_stages: int, refresh_s: float = REFRESH_S,
                 probe: Callable[[str], Awaitable[bool]] | None = None) -> None:
        self.router, self.sdht, self.stage, self.n_stages = router, sdht, stage, n_stages
        self.refresh_s = refresh_s  # the least time between two fresh reads of one stage's announcements
        self.probe = probe  # peer id -> whether it answers (any reply, even a refusal, counts)
        self._refreshed: dict[int, float] = {}
        self._gone: dict[str, float] = {}  # head that failed a probe -> its last announcement's timestamp then
        self._probes: dict[str, tuple[float, asyncio.Task]] = {}
        self.named: Callable[[], frozenset[str]] = frozenset  # stage 1: heads named (peer/commit/head_work.py)

    def _source(self, kind: str) -> tuple[int, tuple[str, ...]] | None:
        """(stage the sender must serve, the states that count), or None if anyone may send it."""
        s = self.stage
        return {KIND_ACTIVATION: (s - 1, LIVE_STATES), KIND_GRADIENT: (s + 1, LIVE_STATES),
                KIND_CONTROL: (0, LIVE_STATES), KIND_DRIVE: (0, LIVE_STATES),
                KIND_REDUCE: (s, LIVE_STATES + ("syncing",)), KIND_FOLLOW: (s, LIVE_STATES)}.get(kind)

    async def _heads(self, fresh: bool = False) -> list[PeerInfo]:
        """The live heads, less those refused here and those that failed this peer's probe and have not announced
        since. A head the router avoids for failing is still one: whom to follow is this probe's to decide."""
        anns = await self.router.announced(0, fresh)
        return [PeerInfo(a.peer_id, 0, a.state, a.step, a.throughput, a.leads) for a in anns
                if a.state in LIVE_STATES and not self.router.refuses(a.peer_id)
                and a.timestamp > self._gone.get(a.peer_id, float("-inf"))]

    async def _leads(self, sender: str) -> Refusal | None:
        """None if `sender` is the head this peer follows (probing a leader it would replace), else
        why not: "retry" while this peer's view may not hold the sender's claim yet."""
        order = await self.router.lease_order()
        if leader_of(await self._heads(), order) == sender:
            return None
        now = time.monotonic()
        fresh = now - self._refreshed.get(0, -self.refresh_s) >= self.refresh_s
        if fresh:
            self._refreshed[0] = now
        heads = await self._heads(fresh)
        if fresh:  # forget heads set aside that no longer announce at all; the coordinator may have re-ordered
            order = await self.router.lease_order(fresh=True)
            announced = {a.peer_id for a in await self.router.announced(0)}
            self._gone = {p: t for p, t in self._gone.items() if p in announced}
        leader = leader_of(heads, order)
        if leader == sender:
            return None
        refused = Refusal("only the leading head drives the steps.")
        if order == []:  # no lease read here yet: the one that names the sender may be on its way through the DHT
            return Refusal(refused.reason, "retry")
        if not any(h.peer_id == sender and h.leads for h in heads):
            # only a claim makes this peer look at the leader again; one it has not read yet may be on its way
            return refused if fresh else Refusal(refused.reason, "retry")
        if leader is None or self.probe is None or await self._answers(leader):
            return refused
        stamps = [a.timestamp for a in await self.router.announced(0) if a.peer_id == leader]
        self._gone[leader] = max(stamps, default=float("inf"))
        return None if leader_of(await self._heads(), order) == sender else refused

    async def _answers(self, head: str) -> bool:
        """One probe of `head` shared by every message that asks meanwhile; at most one per PROBE_S."""
        started, task = self._probes.get(head, (float("-inf"), None))
        if task is None or task.done() and time.monotonic() - started >= PROBE_S:
            task = asyncio.ensure_future(self.probe(head))
            self._probes = {p: v for p, v in self._probes.items() if not v[1].done()} | {head: (time.monotonic(), task)}
        return await asyncio.shield(task)

    async def check(self, sender: str, kind: str) -> Refusal | None:
        """Why `sender` may not send `kind` here, or None. One sentence, with nothing of this stage's state.

        A boundary message (activation, gradient) or a head's command from a sender this peer has not
        yet seen announced is a "retry", not a refusal: announcements spread through the DHT in a moment, so a peer that
        just joined may be read late (the step-1 race of a fresh swarm). The sender sends again to
        this same peer shortly, bans nothing, and each retry lets this peer re-read the sender's
        stage (at most once a second); a stranger gains nothing by it, its retries meet the same answer.
        """
        # the stage's state is the public model, and a replica set aside for a state that differs from its stage's
        # (peer/checks/state_votes.py) is told to download it again, maybe from the only other replica: the very peer
        # that set it aside. Refused by it, it went on with its own state, behind for good (seen under load)
        if self.router.refuses(sender) and kind != KIND_STATE:
            return Refusal("this peer is banned after sending bad data, or for the run.")
        if not await self.sdht.admitted(sender):
            return Refusal("this swarm is private: its coordinator admits peers with a ticket (swarm admit).")
        if kind in (KIND_BASIS, KIND_STATE, KIND_SNAPSHOT, KIND_CONTROL):
            # a basis update carries the swarm key's signature; a stage's state (and its snapshots) is
            # the public model; a command is read first, and only "status" (where this stage is: a
            # liveness probe) is answered without the leader's right (KIND_DRIVE), so a probe costs no DHT read
            return None
        source = self._source(kind)
        if source is None:
            return Refusal(f"messages of kind {kind!r} are not served here.")
        stage, states = source
        if not 0 <= stage < self.n_stages:
            return Refusal(f"no stage sends messages of kind {kind!r} to stage {self.stage}.")
        if not await self._announced(sender, stage, states):
            code = "retry" if kind in (KIND_ACTIVATION, KIND_GRADIENT, KIND_CONTROL, KIND_DRIVE) else "refused"
            return Refusal(f"only peers announced for stage {stage} may send this kind of message here "
                           f"(this peer has not read an announcement of {sender[-8:]} yet).", code)
        if kind == KIND_ACTIVATION and stage == 0 and sender in self.named():
            return None  # a head the leader (whose command was admitted as such) named for the step in progress
        if kind == KIND_DRIVE or kind == KIND_ACTIVATION and stage == 0:
            return await self._leads(sender)
        return None

    async def _announced(self, sender: str, stage: int, states: tuple[str, ...]) -> bool:
        if any(a.peer_id == sender and a.state in states for a in await self.router.announced(stage)):
            return True
        now = time.monotonic()
        if now - self._refreshed.get(stage, -self.refresh_s) < self.refresh_s:
            return False
        self._refreshed[stage] = now
        return any(a.peer_id == sender and a.state in states for a in await self.router.announced(stage, fresh=True))

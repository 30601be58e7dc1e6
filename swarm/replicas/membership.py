"""`Membership`: who may send what to this stage, from the signed stage announcements.

Each kind of message may come only from peers that are announced (and, in a private swarm,
admitted with a ticket) for the stage it belongs to:

    act          peers of the previous stage; at stage 1, only the leading head
    grad         peers of the next stage
    ctl          status: any head; reduce, apply, abort: only the leading head
    red          replicas of this stage             fol    peers of this stage (the donor)
    state        any admitted peer: a joining replica, or `swarm export` (the model is the swarm's)
    basis        anyone: the update itself is signed by the swarm key

The leading head is the one the heads themselves follow (`peer/driver.py`): the lowest peer id
among the live heads this peer has not seen fail. So a peer that merely announces itself as a
head cannot feed stage 1 microbatches of its own, nor abort or commit the leader's steps.

and never from a peer this process banned for sending bad data. Announcements are read
through the router's 2 s cache; a sender not found there causes one fresh read of that
stage, at most once a second, so a newcomer is admitted within a second while a stranger
cannot make this peer hammer the DHT.
"""
from __future__ import annotations

import time

from peer.interfaces import Refusal
from protocol.wire import (
    KIND_ACTIVATION,
    KIND_BASIS,
    KIND_CONTROL,
    KIND_DRIVE,
    KIND_FOLLOW,
    KIND_GRADIENT,
    KIND_REDUCE,
    KIND_STATE,
)
from swarm.dht import SwarmDHT
from swarm.replicas.router import LIVE_STATES, Router

REFRESH_S = 1.0


class Membership:
    def __init__(self, router: Router, sdht: SwarmDHT, stage: int, n_stages: int, refresh_s: float = REFRESH_S) -> None:
        self.router, self.sdht, self.stage, self.n_stages = router, sdht, stage, n_stages
        self.refresh_s = refresh_s  # the least time between two fresh reads of one stage's announcements
        self._refreshed: dict[int, float] = {}

    def _source(self, kind: str) -> tuple[int, tuple[str, ...]] | None:
        """(stage the sender must serve, the states that count), or None if anyone may send it."""
        s = self.stage
        return {KIND_ACTIVATION: (s - 1, LIVE_STATES), KIND_GRADIENT: (s + 1, LIVE_STATES),
                KIND_CONTROL: (0, LIVE_STATES), KIND_DRIVE: (0, LIVE_STATES),
                KIND_REDUCE: (s, LIVE_STATES + ("syncing",)), KIND_FOLLOW: (s, LIVE_STATES)}.get(kind)

    async def _leader(self) -> str | None:
        """The lowest peer id among the live heads this peer has not seen fail (a head that died is
        followed by its successor once this peer's router failed to reach it, or its
        announcement expired, or it announced that it leaves)."""
        heads = [a.peer_id for a in await self.router.live_peers(0)]
        return min(heads) if heads else None

    async def check(self, sender: str, kind: str) -> Refusal | None:
        """Why `sender` may not send `kind` here, or None. One sentence, with nothing of this stage's state.

        A boundary message (activation, gradient) or a head's command from a sender this peer has not
        yet seen announced is a "retry", not a refusal: announcements spread through the DHT in a moment, so a peer that
        just joined may be read late (the step-1 race of a fresh swarm). The sender sends again to
        this same peer shortly, bans nothing, and each retry lets this peer re-read the sender's
        stage (at most once a second); a stranger gains nothing by it, its retries meet the same answer.
        """
        if self.router.is_banned(sender):
            return Refusal("this peer is banned for a while after failing or sending bad data.")
        if not await self.sdht.admitted(sender):
            return Refusal("this swarm is private: its coordinator admits peers with a ticket (swarm admit).")
        if kind in (KIND_BASIS, KIND_STATE):
            return None  # a basis update carries the swarm key's signature; a stage's state is the public model
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
        if (kind == KIND_DRIVE or kind == KIND_ACTIVATION and stage == 0) and sender != await self._leader():
            return Refusal("only the leading head drives the steps.")
        return None

    async def _announced(self, sender: str, stage: int, states: tuple[str, ...]) -> bool:
        if any(a.peer_id == sender and a.state in states for a in await self.router.announced(stage)):
            return True
        now = time.monotonic()
        if now - self._refreshed.get(stage, -self.refresh_s) < self.refresh_s:
            return False
        self._refreshed[stage] = now
        return any(a.peer_id == sender and a.state in states for a in await self.router.announced(stage, fresh=True))

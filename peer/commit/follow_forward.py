"""`FollowForwarder`: a replica's reduced sums, forwarded to replicas still catching up after a
state download (peer/state/state_transfer.py), until they take part in a reduce themselves; and the
catching-up replica's side, which takes them (`serve`)."""
from __future__ import annotations

import logging
from collections.abc import Callable

from peer.daemon.daemon import StageDaemon
from peer.daemon.delivery import ACK
from peer.daemon.transfer_time import TransferWait
from peer.runner.reduced import Reduced
from protocol.flat_limits import FlatLimits
from protocol.state_wire import FollowUpdate, decode_follow, encode_follow
from protocol.wire import KIND_FOLLOW, WireError

log = logging.getLogger(__name__)


class FollowForwarder:
    def __init__(self, daemon: StageDaemon, limits: FlatLimits, wait: TransferWait) -> None:
        self.daemon, self.stage, self.limits, self.wait = daemon, daemon.stage, limits, wait
        self.followers: dict[str, int] = {}  # replicas catching up from this one -> first step they need

    def follow_from(self, peer: str, step: int) -> None:
        """Forward every reduced sum from `step` on to `peer` until it takes part in a reduce. Call
        it on the worker thread, with the snapshot taken there: every step applied after the
        snapshot is then applied after this, and reaches the follower."""
        self.followers[peer] = step

    async def serve(self, on_update: Callable[[FollowUpdate, str], str | None]) -> None:
        """A catching-up replica: take the reduced sums its donor forwards."""
        async def handler(body: bytes, sender: str) -> bytes:
            if (refusal := await self.daemon.admitted(sender, KIND_FOLLOW)) is not None:
                return refusal
            try:
                update = decode_follow(body, self.limits)
            except WireError as e:
                return self.daemon.refuse(str(e), sender)
            problem = on_update(update, sender)
            return self.daemon.refuse(problem, sender) if problem else ACK
        await self.daemon.link.serve(KIND_FOLLOW, handler)

    def forward(self, reduced: Reduced, skip: bool) -> None:
        for peer in [p for p in list(self.followers) if p in reduced.contributors]:
            del self.followers[peer]  # it took part in the reduce itself: in step from here on
        body = None  # encoded once for every follower of the step (a whole gradient is stages' worth of bytes)
        for peer, first in list(self.followers.items()):
            if reduced.step >= first:
                body = body or encode_follow(self.update(reduced, skip))
                self.daemon.spawn(self._send_follow(peer, body))

    def update(self, reduced: Reduced, skip: bool) -> FollowUpdate:
        """What a follower gets of an applied step: a powersgd step's sums when the reduce kept them (the
        size of about two contributions), else the reduced gradient itself."""
        run = self.daemon.spec.run_hash
        if skip:
            return FollowUpdate(run, reduced.step, None, None, reduced.in_layout, True)
        if reduced.factors is not None:
            return FollowUpdate(run, reduced.step, None, reduced.stat, True, factors=reduced.factors)
        return FollowUpdate(run, reduced.step, reduced.grads, reduced.stat, reduced.in_layout)

    async def _send_follow(self, peer: str, body: bytes) -> None:
        try:
            await self.daemon.link.request(peer, KIND_FOLLOW, body, timeout=self.wait.seconds(len(body)))
        except Exception as e:  # the follower re-downloads if it misses one
            log.warning("stage %d: could not forward a reduced gradient to %s (%s)", self.stage, peer[-8:], e)
            self.followers.pop(peer, None)

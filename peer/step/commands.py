"""`CommandSender`: the leading head's commands (status, reduce, apply, abort, rollback) to the
peers of the swarm, one at a time or to many at once (protocol/control.py). A peer that cannot
be reached, refuses or answers garbage takes no part: its reply is "failed", never an error.
An abort names the replicas the leader convicted (peer/checks/spot_checks.py), and each of them is told why.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from peer.checks.spot_checks import SpotChecks
from peer.commit.commit import StepCommit
from peer.daemon.daemon import StageDaemon
from peer.daemon.delivery import retry_asked
from peer.daemon.interfaces import LinkError
from protocol.control import Command, CommandReply, decode_reply, encode_command
from protocol.wire import KIND_CONTROL, WireError

log = logging.getLogger(__name__)

UNREACHABLE = "unreachable: "  # the reason of a command that never reached its peer


class CommandSender:
    def __init__(self, daemon: StageDaemon, commit: StepCommit, command_timeout: float) -> None:
        self.daemon, self.commit, self.command_timeout = daemon, commit, command_timeout
        self.named: list[str] = []  # who reduced the last step the leader committed: every apply names them
        self.banned: list[str] = []  # replicas the leader convicted (checks/spot_checks.py): every abort names them
        self.disputed: list[int] = []  # stages whose two replicas disagree at the step aborted: they wait for a third
        self._told: set[str] = set()  # convicted replicas told of their ban
        self.peer_id, self.run_hash = daemon.peer_id, daemon.spec.run_hash
        self.n_microbatches = daemon.spec.n_microbatches
        # hears every (peer, (steps applied, state sha256)) an apply reply carries (peer/checks/state_votes.py)
        self.on_apply: Callable[[str, tuple[int, str]], None] | None = None
        # this head's own apply replies before its state is hashed (peer/commit/commit.py): its hash comes here
        commit.hasher.on_hashed.append(lambda state: self.on_apply(self.peer_id, state) if self.on_apply else None)

    async def broadcast(self, peers: dict[str, int], op: str, step: int, attempt: int,
                        skip: bool = False) -> dict[str, CommandReply]:
        cmds = {p: Command(self.run_hash, step, attempt, op, self.named if op == "apply" else [], skip=skip,
                           banned=self.banned if op == "abort" else [],
                           disputed=self.disputed if op == "abort" else []) for p in peers}
        return dict(zip(cmds, await asyncio.gather(*(self.send(p, c) for p, c in cmds.items()))))

    async def command(self, peer: str, op: str, step: int, attempt: int,
                       timeout: float | None = None) -> CommandReply:
        return await self.send(peer, Command(self.run_hash, step, attempt, op), timeout)

    async def send(self, peer: str, cmd: Command, timeout: float | None = None) -> CommandReply:
        """One command to one peer. A peer that asks to retry (it has not read this head's
        announcement yet) is asked again every 0.2 s within the command's timeout."""
        if peer == self.peer_id:
            return self._heard(peer, cmd, await self.commit.handle(cmd, local=True))
        body, deadline = encode_command(cmd), time.monotonic() + (timeout or self.command_timeout)
        while True:
            try:
                reply = await self.daemon.link.request(peer, KIND_CONTROL, body,
                                                       timeout=max(0.1, deadline - time.monotonic()))
                try:
                    return self._heard(peer, cmd, decode_reply(reply, self.n_microbatches))
                except WireError:  # not a reply: a refusal, perhaps one that asks to retry
                    retry = retry_asked(reply, self.daemon._limits())
                    if retry is None:
                        raise
                    if time.monotonic() + 0.2 > deadline:
                        raise WireError(retry) from None
            except Exception as e:  # unreachable, refused or garbled: this peer takes no part
                why = f"{UNREACHABLE}{e}" if isinstance(e, LinkError) else str(e)
                return CommandReply(cmd.step, cmd.attempt, "failed", reason=why[:200])
            await asyncio.sleep(0.2)  # the peer is reading this head's announcement

    def _heard(self, peer: str, cmd: Command, reply: CommandReply) -> CommandReply:
        if cmd.op == "apply" and reply.outcome == "ok" and reply.state is not None and self.on_apply is not None:
            self.on_apply(peer, reply.state)
        return reply

    async def abort(self, peers: dict[str, int], step: int, attempt: int, spot: SpotChecks) -> None:
        """Abort the attempt on `peers` (peer -> stage), banning the replicas `spot` convicted everywhere, and tell
        each newly convicted one, once and in the background, why: it stops (peer/commit/commit.py) instead of
        standing by for a step that no honest peer will give it."""
        self.banned, self.disputed = list(spot.convicted), spot.disputed_stages(step)
        await self.broadcast(peers, "abort", step, attempt)
        for peer in [p for p in spot.convicted if p not in self._told and p != self.peer_id]:
            self._told.add(peer)
            cmd = Command(self.run_hash, step, attempt, "abort", banned=list(spot.convicted),
                          why=spot.reasons.get(peer, ""))
            self.daemon.spawn(self.send(peer, cmd, timeout=5.0))

    async def apply_everywhere(self, peers: dict[str, int], step: int, attempt: int, skip: bool) -> None:
        """Tell `peers` (peer -> stage) to apply the step; a stage none of whose replicas applied it is
        asked again for `command_timeout` (it holds the sum; a repeated apply is answered "ok")."""
        applied = await self.broadcast(peers, "apply", step, attempt, skip)
        deadline = time.monotonic() + self.command_timeout
        def missing() -> list[int]:  # stages with no replica that applied (this head applied stage 0's)
            return sorted(set(peers.values()) - {0} - {peers[p] for p, r in applied.items() if r.outcome == "ok"})

        while missing():
            if time.monotonic() > deadline:
                log.warning("stages %s did not apply step %d; without a replica that did, they have to be refilled",
                            missing(), step + 1)
                return
            await asyncio.sleep(0.5)  # let the view of who leads settle before asking again
            applied.update(await self.broadcast({p: s for p, s in peers.items() if s in missing()}, "apply", step,
                                                 attempt, skip))
        for p, r in applied.items():
            if r.outcome != "ok":
                log.warning("replica %s of stage %d did not apply step %d (%s); it will catch up",
                            p[-8:], peers[p], step + 1, r.reason or r.outcome)

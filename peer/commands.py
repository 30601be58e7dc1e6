"""`CommandSender`: the leading head's commands (status, reduce, apply, abort, rollback) to the
peers of the swarm, one at a time or to many at once (protocol/control.py). A peer that cannot
be reached, refuses or answers garbage takes no part: its reply is "failed", never an error.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from protocol.control import Command, CommandReply, decode_reply, encode_command
from protocol.wire import KIND_CONTROL, WireError

from .commit import StepCommit
from .daemon import StageDaemon
from .delivery import retry_asked
from .interfaces import LinkError

UNREACHABLE = "unreachable: "  # the reason of a command that never reached its peer


class CommandSender:
    def __init__(self, daemon: StageDaemon, commit: StepCommit, command_timeout: float) -> None:
        self.daemon, self.commit, self.command_timeout = daemon, commit, command_timeout
        self.named: list[str] = []  # who reduced the last step the leader committed: every apply names them
        self.banned: list[str] = []  # replicas the leader caught lying about their work: every abort names them
        self.peer_id, self.run_hash = daemon.peer_id, daemon.spec.run_hash
        self.n_microbatches = daemon.spec.n_microbatches
        # hears every (peer, (steps applied, state sha256)) an apply reply carries (peer/state_votes.py)
        self.on_apply: Callable[[str, tuple[int, str]], None] | None = None

    async def broadcast(self, peers: dict[str, int], op: str, step: int, attempt: int,
                        skip: bool = False) -> dict[str, CommandReply]:
        cmds = {p: Command(self.run_hash, step, attempt, op, self.named if op == "apply" else [], skip=skip,
                           banned=self.banned if op == "abort" else []) for p in peers}
        return dict(zip(cmds, await asyncio.gather(*(self.send(p, c) for p, c in cmds.items()))))

    async def command(self, peer: str, op: str, step: int, attempt: int,
                       timeout: float | None = None) -> CommandReply:
        return await self.send(peer, Command(self.run_hash, step, attempt, op), timeout)

    async def send(self, peer: str, cmd: Command, timeout: float | None = None) -> CommandReply:
        """One command to one peer. A peer that asks to retry (it has not read this head's
        announcement yet) is asked again every 0.2 s within the command's timeout."""
        if peer == self.peer_id:
            return self._heard(peer, cmd, await self.commit.handle(cmd))
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

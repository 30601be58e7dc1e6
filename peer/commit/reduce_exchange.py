"""`ReduceExchange`: the messages of one replica's reduce with the other replicas of its stage.

A reduce phase (the exact sum's one, powersgd's two) is: send our contribution to every
candidate (`offer`; one that is not at this step, or unreachable, takes no part), then gather
theirs of the same (step, attempt, phase) from the inbox that `receive` fills, probing the ones
still missing (`peer/commit/reduce_watch.py`). What the exchange learns for the command's reply lives
here too: the replicas whose contribution was refused (`blame`) and the bytes sent per attempt.
`peer/commit/commit.py` decides what to send and what to do with the sums.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from peer.daemon.daemon import StageDaemon
from peer.daemon.delivery import ACK
from peer.daemon.transfer_time import TransferWait
from protocol.control import Contribution, ReduceProbe, encode_contribution, encode_probe
from protocol.wire import KIND_REDUCE, ErrorReply, WireError, decode_message

from .reduce_watch import ReduceWatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refused:
    """A contribution that arrived and was refused: its sender spoils the reduce and is named."""
    reason: str


class ReduceExchange:
    def __init__(self, daemon: StageDaemon, wait: TransferWait, watch_options: dict) -> None:
        self.daemon, self.runner, self.stage = daemon, daemon.runner, daemon.stage
        self.wait = wait  # a phase's deadline grows with the bytes it sends (peer/daemon/transfer_time.py)
        self._watch_options = watch_options
        self._inbox: dict[tuple[int, int, int], dict[str, Contribution | Refused]] = {}  # (step, attempt, phase)
        self._arrived = asyncio.Event()
        self.blame: dict[tuple[int, int], list[str]] = {}  # replicas whose contribution this one refused
        self.sync_bytes = 0  # contribution bytes this replica sent to other replicas, every phase and attempt
        self._attempt_bytes: dict[tuple[int, int], int] = {}

    def attempt_bytes(self, step: int, attempt: int) -> int:
        """What this attempt's reduce sent (forgotten once asked: the apply asks once)."""
        return self._attempt_bytes.pop((step, attempt), 0)

    def drop(self, step: int, attempt: int) -> None:
        """The attempt's sum is taken: its contributions are no longer needed."""
        for key in [k for k in self._inbox if k[:2] == (step, attempt)]:
            del self._inbox[key]

    async def exchange(self, step: int, attempt: int, mine: Contribution, peers: list[str],
                       everyone: bool = False) -> dict[str, Contribution] | str:
        """Send `mine` to `peers` and gather theirs of the same phase: {peer: contribution}, ours
        included. A peer that is not at this step is left out, unless `everyone` must take
        part; a string says why the exchange failed."""
        body = encode_contribution(mine)
        timeout = self.wait.seconds(len(body) * len(peers))
        offers = await asyncio.gather(*(self._offer(p, body, timeout) for p in peers))
        key = (step, attempt)
        self.sync_bytes += len(body) * len(peers)
        self._attempt_bytes = {k: v for k, v in self._attempt_bytes.items() if k[0] == step}
        self._attempt_bytes[key] = self._attempt_bytes.get(key, 0) + len(body) * len(peers)
        members = [p for p, ok in zip(peers, offers) if ok]
        if everyone and len(members) < len(peers):
            return "a replica left the reduce between its two rounds."
        got = await self._gather(step, attempt, mine.phase, members, timeout)
        if not isinstance(got, str) and (refused := sorted(p for p, c in got.items() if isinstance(c, Refused))):
            self.blame = {key: refused}
            got = f"replica {refused[0][-8:]}'s contribution was refused: {got[refused[0]].reason}"
        if isinstance(got, str):
            log.info("stage %d: reduce of step %d, attempt %d: %s", self.stage, step + 1, attempt, got)
            return got
        return {self.daemon.peer_id: mine, **got}

    async def _offer(self, peer: str, body: bytes, timeout: float) -> bool:
        """Send our contribution to one candidate; False if it is not at this step or unreachable."""
        try:
            reply = await self.daemon.link.request(peer, KIND_REDUCE, body, timeout=timeout)
        except Exception as e:  # a dead or unreachable candidate simply takes no part
            log.info("stage %d: replica %s takes no part in the reduce (%s)", self.stage, peer[-8:], e)
            return False
        if reply == ACK:
            return True
        try:
            err = decode_message(reply, self.daemon._limits())
            reason = err.reason if isinstance(err, ErrorReply) else "an unexpected reply"
        except WireError as e:
            reason = str(e)
        log.info("stage %d: replica %s takes no part in the reduce: %s", self.stage, peer[-8:], reason)
        return False

    async def _gather(self, step: int, attempt: int, phase: int, members: list[str],
                      timeout: float) -> dict[str, Contribution] | str:
        """The `members`' contributions of this phase, or why they will not all come."""
        probe = encode_probe(ReduceProbe(self.daemon.spec.run_hash, step, attempt, self.stage))
        watch = ReduceWatch(self.daemon.link, probe, members, self._arrived, **self._watch_options,
                            out=self.daemon.directory.refuses)

        def current() -> bool:
            return (step, attempt) == (self.runner.step, self.daemon.attempt)
        got = await watch.gather(lambda: self._inbox.get((step, attempt, phase), {}), current, timeout)
        if watch.blamed:
            self.blame = {(step, attempt): watch.blamed}
        return got

    def refuse(self, step: int, attempt: int, phase: int, sender: str, reason: str) -> None:
        """A contribution of the attempt in progress that could not be read: the reduce ends at once
        and names its sender."""
        if (step, attempt) == (self.runner.step, self.daemon.attempt):
            self._inbox.setdefault((step, attempt, phase), {}).setdefault(sender, Refused(reason))
            self._arrived.set()

    def receive(self, c: Contribution, sender: str) -> bytes:
        """Keep a replica's contribution for the phase it belongs to; ACK, or why not. Held: the step in
        progress's, none older than this replica's attempt or than one of the same sender held, one per sender
        and phase; a newer attempt's drops every older one's."""
        d = self.daemon
        if c.step != self.runner.step:
            return d.refuse("the contribution is not for the step in progress here.", sender,
                            code="behind" if c.step > self.runner.step else "refused")
        if c.attempt < d.attempt:
            return d.refuse("the contribution belongs to an attempt that was superseded.", sender, code="stale")
        if any(k[0] == c.step and k[1] > c.attempt and sender in box for k, box in self._inbox.items()):
            # its contribution to a newer attempt is held: without this, older attempts sent newest first would
            # each be held beside it (one per attempt, each as large as the stage's gradient)
            return d.refuse("this replica's contribution to a newer attempt is already here.", sender, code="stale")
        box = self._inbox.setdefault((c.step, c.attempt, c.phase), {})
        if sender in box:
            return d.refuse("this replica's contribution is already here.", sender, code="duplicate")
        for key in [k for k in self._inbox if k[0] != c.step or k[1] < c.attempt]:
            del self._inbox[key]  # only the current step's newest attempts are kept: memory stays bounded
        box[sender] = c
        self._arrived.set()
        return ACK


"""`AttemptWatch`: while a step's microbatches are out, the leading head notices within seconds
that a peer holding them died, instead of waiting out the attempt's timeout (issue 19, item 3).

A microbatch handed to a peer that then dies is acknowledged and never comes back: nothing
fails, the head only sees time pass (15 s at least, `StepDriver.min_timeout`). So every
`period` seconds the head asks each live peer of the swarm for its status (one small control
command, as a standby head pings its leader); any reply proves the process alive. A peer that
fails `failures` pings in a row, each within `timeout`, is reported to the directory (routers
avoid it) and ends the attempt, which the driver re-drives at once. A killed peer's port
refuses at once, so that takes about `failures` x `period` seconds; a machine that vanished,
`failures` x (`period` + `timeout`). A live peer that is slow to answer needs to miss
`failures` pings in a row before it costs a re-drive, and a re-drive costs time, never a step.
The leading head's `timeout` is `StepDeadlines.ping` (peer/daemon/transfer_time.py): a reply may wait behind
one activation or gradient on the peer's busy uplink.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from peer.daemon.interfaces import MessageLink, PeerDirectory
from protocol.control import Command, encode_command
from protocol.wire import KIND_CONTROL

log = logging.getLogger(__name__)


class AttemptWatch:
    def __init__(self, link: MessageLink, directory: PeerDirectory, run: str, period: float = 1.0,
                 timeout: float = 2.0, failures: int = 3) -> None:
        self.link, self.directory, self.run = link, directory, run
        self.period, self.timeout, self.failures = period, timeout, failures

    async def first_silent(self, members: Callable[[], Awaitable[list[str]]], step: int) -> str:
        """Ping every peer `members()` lists at the start or in any round (a router that saw a peer
        fail stops listing it, but it may hold work of the step) until one fails `failures` pings
        in a row; return it."""
        missed: dict[str, int] = {}
        body = encode_command(Command(self.run, step, 0, "status"))

        async def answers(peer: str) -> bool:
            try:
                await self.link.request(peer, KIND_CONTROL, body, timeout=self.timeout)
                return True
            except asyncio.CancelledError:
                raise
            except Exception:  # unreachable, reset or silent: one miss
                return False
        known = set(await members())  # as the attempt starts: a router may stop listing a peer that failed it
        while True:
            await asyncio.sleep(self.period)  # the ping schedule
            known |= set(await members())
            peers = sorted(known)
            alive = await asyncio.gather(*map(answers, peers))
            missed = {p: 0 if ok else missed.get(p, 0) + 1 for p, ok in zip(peers, alive)}
            silent = sorted(p for p, n in missed.items() if n >= self.failures)
            if silent:
                for peer in silent:
                    self.directory.report_failure(peer)
                return silent[0]

"""Liveness probes: does a peer listed in the DHT still answer?

A peer's records (stage announcement, health record) outlive it by up to their ttl (15 s by
default): a killed peer stops refreshing them, nothing removes them. A reader that must not
show a dead peer as serving (`swarm status`, the dashboard) asks each listed peer itself:
one "status" control command (`protocol/control.py`, a few dozen bytes) over the swarm's
transport, the request every standby head sends its leader. Any reply, a refusal included
(a reader is no member of the stage), proves the peer's process is alive: the request went
through its p2pd to its own handler. So does p2pd's "protocols not supported" (its libp2p host
is up, the process has not started serving control commands yet: a peer still joining).
Not an answer: a refused or failed dial (a killed peer's port refuses at once), a stream
that breaks before the reply (a killed process behind a p2pd that outlived it), no reply
within `PROBE_TIMEOUT_S` (a vanished machine). A relayed peer is probed like any request to
it: p2pd dials it through its relay.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from protocol.control import Command, encode_command
from protocol.wire import KIND_CONTROL
from swarm.net.transport import Transport, TransportError

__all__ = ["PROBE_TIMEOUT_S", "MAX_CONCURRENT_PROBES", "LivenessProbe", "is_an_answer"]

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0
MAX_CONCURRENT_PROBES = 16  # a reader probes at most this many peers at once
MAX_REPLY_BYTES = 64 << 10  # a status reply is a few dozen bytes; read nothing big from a stranger
NOT_SERVED = "protocols not supported"  # p2pd's words for a protocol the remote host does not serve (yet)


def is_an_answer(error: TransportError) -> bool:
    """Whether a failed request still proves the remote process alive (see the module docstring)."""
    return error.reason in ("remote", "protocol") or (error.reason == "connection" and NOT_SERVED in str(error))


class LivenessProbe:
    """Probes peers of one run over a P2P (a reader's `dht.replicate_p2p()`); it serves nothing."""

    def __init__(self, p2p, timeout: float = PROBE_TIMEOUT_S, concurrency: int = MAX_CONCURRENT_PROBES) -> None:
        self.p2p, self.timeout = p2p, timeout
        self._slots = asyncio.Semaphore(concurrency)

    async def answers(self, run_hash: str, peer: str, transport: Transport | None = None) -> bool:
        """Whether `peer` answers one status command within the timeout; never raises."""
        transport = transport or self._transport(run_hash)
        body = encode_command(Command(run_hash, 0, 0, "status"))
        async with self._slots:
            try:
                await transport.request(peer, KIND_CONTROL, body, timeout=self.timeout)
                return True
            except TransportError as e:
                if is_an_answer(e):
                    return True
                log.debug("peer %s does not answer: %s", peer, e)
                return False
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the local p2pd itself failing: say so, count it as no answer
                log.debug("could not probe peer %s (%s: %s)", peer, type(e).__name__, e)
                return False

    def checker(self, run_hash: str, transport: Transport | None = None) -> Callable[[str], Awaitable[bool]]:
        """`answers` bound to one run (and transport): peer id -> whether it answers."""
        return functools.partial(self.answers, run_hash, transport=transport)

    async def probe_all(self, run_hash: str, peers: list[str]) -> dict[str, bool]:
        """peer -> answers, for every peer of `peers`, at most `concurrency` probes at a time."""
        transport = self._transport(run_hash)  # one per round: its byte counters never pile up
        results = await asyncio.gather(*(self.answers(run_hash, p, transport) for p in peers))
        return dict(zip(peers, results))

    def _transport(self, run_hash: str) -> Transport:
        return Transport(self.p2p, f"subspace-swarm-{run_hash}", max_frame_bytes=MAX_REPLY_BYTES,
                         timeout=self.timeout)

"""`Courier`: how a stage's outbound messages reach the next or previous stage.

A message goes to a named peer (a gradient goes back to whoever sent the activation) or to a
replica of a stage picked by the router, trying others when one fails. A receiver that asks
to retry (it is fetching a basis update, or has not read the sender's announcement yet) gets
the same message again after a short, bounded wait; a transport failure is retried once on
the same peer, since it may hide a message that arrived but whose reply was lost.

Every boundary message leaves signed for the peer it goes to (protocol/boundary_sig.py): the statement
names the receiver, so it is signed again for each peer tried; the body's bytes are the same for all.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from protocol.boundary_sig import seal, statement
from protocol.spot_check import digest
from protocol.wire import KIND_ACTIVATION, KIND_GRADIENT, ErrorReply, Header, WireError, WireLimits, decode_message

from .interfaces import LinkError, MessageLink, PeerDirectory

ACK = b""


class Courier:
    def __init__(self, link: MessageLink, directory: PeerDirectory, stage: int, limits: Callable[[], WireLimits], *,
                 send_retries: int = 3, basis_wait: float = 30.0) -> None:
        self.link, self.directory, self.stage, self._limits = link, directory, stage, limits
        self.send_retries, self.basis_wait = send_retries, basis_wait
        self.sent_tokens = {KIND_ACTIVATION: 0, KIND_GRADIENT: 0}  # tokens per kind, for bytes-per-token
        self._retries: dict[str, int] = {}

    async def send(self, stage: int, kind: str, body: bytes, tokens: int, to: str | None = None,
                   chosen: Callable[[str | None], None] | None = None, exclude: set[str] = frozenset(),
                   h: Header | None = None, said: bytes | None = None) -> str:
        """Deliver to `to`, or to a peer of `stage` picked by the router (never one of `exclude`),
        trying other peers; returns the peer that took it. `chosen(peer)` hears of each peer before
        it is sent to (its answer may come back before its acknowledgement does), and
        `chosen(None)` if it did not take the message. `h`: the message's header, which its signature
        names (None: sent unsigned); `said`: the body's digest, if the caller has it (else computed once here)."""
        if h is not None and said is None and getattr(self.link, "signer", None) is not None:
            said = digest(body)
        tried: set[str] = set(exclude)
        last, peer = "", None
        for _ in range(self.send_retries if to is None else 1):
            try:
                peer = to or await self.directory.pick(stage, exclude=tried)
            except LinkError:
                if not last:
                    raise
                break  # every peer of the stage was tried: say why the last one refused
            if chosen is not None:
                chosen(peer)
            outcome, last = await self.deliver(peer, kind, self.signed(peer, kind, body, h, said))
            if outcome == "ok":
                self.sent_tokens[kind] += tokens
                self._retries.pop(peer, None)
                return peer
            if chosen is not None:
                chosen(None)
            if to is None:
                self.directory.release(peer, None)
            if outcome == "retry" and await self._retry_later(peer):
                return await self.send(stage, kind, body, tokens, to=peer, chosen=chosen, h=h, said=said)
            tried.add(peer)
        raise LinkError(f"stage {self.stage} could not deliver a '{kind}' message to stage {stage}: {last}", peer)

    def signed(self, peer: str, kind: str, body: bytes, h: Header | None, said: bytes | None = None) -> bytes:
        """`body` sealed with this peer's signature of (run, step, attempt, microbatch, kind, `peer`, digest)."""
        signer = getattr(self.link, "signer", None)
        if signer is None or h is None:
            return body
        said = digest(body) if said is None else said
        return seal(signer.sign(statement(h.run, h.step, h.attempt, h.microbatch, kind, peer, said)), body)

    async def deliver(self, peer: str, kind: str, body: bytes) -> tuple[str, str]:
        """One message to one peer: ("ok" | "retry" | "failed", why).

        A transport failure can hide a message that arrived but whose reply was lost, so the
        same peer is asked once more; a "duplicate" refusal then means the first one arrived.
        """
        last = ""
        for attempt in range(2):
            try:
                reply = await self.link.request(peer, kind, body)
            except Exception as e:  # transport failures of any kind
                last = str(e)
                if attempt == 0:
                    await asyncio.sleep(0.2)  # a short pause before asking the same peer again
                    continue
                self.directory.report_failure(peer)
                return "failed", last
            if reply == ACK:
                return "ok", ""
            try:
                err = decode_message(reply, self._limits())
            except WireError as e:
                return "failed", f"an unreadable reply ({e})"
            if not isinstance(err, ErrorReply):
                return "failed", "an unexpected reply"
            if err.code == "duplicate" and attempt == 1:
                return "ok", ""
            return ("retry" if err.code == "retry" else "failed"), err.reason
        return "failed", last

    async def _retry_later(self, peer: str) -> bool:
        """The receiver asked to retry (it is fetching a basis update, or has not read this peer's
        announcement yet): wait a little, bounded by `basis_wait` in all."""
        n = self._retries.get(peer, 0)
        if n * 0.2 > self.basis_wait:
            return False
        self._retries[peer] = n + 1
        await asyncio.sleep(0.2)  # back-off before re-sending to a peer that asked for it
        return True


def retry_asked(body: bytes, limits: WireLimits) -> str | None:
    """The reason of a "retry" refusal, or None if `body` is anything else."""
    try:
        err = decode_message(body, limits)
    except WireError:
        return None
    return err.reason if isinstance(err, ErrorReply) and err.code == "retry" else None

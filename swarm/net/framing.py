"""The framing both of a transport's routes share: sizes, the error a request can end in, byte counters.

`swarm/net/transport.py` documents the frames (libp2p: a 4-byte length before a request, a status and a
length before a reply); `swarm/net/direct.py` the direct channel's, which add a kind and a tag.
"""
from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

from .direct import direct_framing

__all__ = ["TransportError", "LinkCounter", "FrameError", "REQUEST_OVERHEAD", "REPLY_OVERHEAD", "STATUS_OK",
           "STATUS_ERROR", "DIRECT_MIN_BYTES", "framing_bytes", "short_text", "check_name"]

LENGTH = struct.Struct(">I")
REPLY_HEADER = struct.Struct(">BI")
REQUEST_OVERHEAD = LENGTH.size
REPLY_OVERHEAD = REPLY_HEADER.size
STATUS_OK = 0
STATUS_ERROR = 1
MAX_LENGTH_FIELD = 2**32 - 1
SMALL_REQUEST_BYTES = 4096  # a request this small measures the round trip (swarm/net/send_order.py)
DIRECT_MIN_BYTES = 64 << 10  # smaller frames stay on libp2p: its rate matters little for them


def framing_bytes(kind: str, body_bytes: int, direct_min_bytes: int | None = DIRECT_MIN_BYTES) -> int:
    """What a request of `body_bytes` and its empty reply cost on the wire beyond the body: libp2p's 4 + 5 bytes,
    or the direct channel's (swarm/net/direct.py) for a body it carries between peers that can dial each other
    (`direct_min_bytes` None: the channel is off)."""
    if direct_min_bytes is not None and body_bytes >= direct_min_bytes:
        return direct_framing(kind)
    return REQUEST_OVERHEAD + REPLY_OVERHEAD


class TransportError(RuntimeError):
    """A request that did not get a good reply; the message is one sentence for a log or a user.

    `kind` is the message kind, `peer` the remote peer id, and `reason` one of "remote" (the
    other side replied with an error), "timeout", "connection", "limit" or "protocol".
    """

    def __init__(self, message: str, *, kind: str, peer: str, reason: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.peer = peer
        self.reason = reason


@dataclass
class LinkCounter:
    peer: str
    kind: str
    direction: str  # "out" | "in"
    bytes: int = 0
    messages: int = 0


class FrameError(Exception):
    """A request frame the server could not accept; its text is the error reply."""

    def __init__(self, message: str, *, sender_busy: bool = False) -> None:
        super().__init__(message)
        self.sender_busy = sender_busy  # the client is probably still writing the body


# p2pd turns our close of a stream into a reset, which drops a reply the client has not read
# yet; after refusing an oversized frame we therefore discard (never buffer) what the client
# is still sending, for at most this long, so that it can read why it was refused.
REFUSAL_LINGER_S = 2.0


def check_name(what: str, name: str) -> str:
    if not name or any(c in name for c in "/ \t\r\n"):
        raise ValueError(f"{what} {name!r} must be non-empty and contain no '/' or whitespace.")
    return name


REPLY_LINGER_S = 10.0


async def wait_for_close(reader: asyncio.StreamReader, seconds: float) -> None:
    try:
        await asyncio.wait_for(reader.read(1), seconds)
    except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError):
        pass


async def discard(reader: asyncio.StreamReader, seconds: float) -> None:
    async def drain() -> None:
        while await reader.read(1 << 16):
            pass

    try:
        await asyncio.wait_for(drain(), seconds)
    except (TimeoutError, ConnectionError, OSError):
        pass


def short_text(error: BaseException | str, limit: int = 200) -> str:
    # Remote text is untrusted and may be huge: keep log lines and exception messages short.
    text = (error if isinstance(error, str) else str(error) or type(error).__name__).strip()
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text if isinstance(error, str) else text.rstrip(".")

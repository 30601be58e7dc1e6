"""The run's tokenizer file moving between peers (kind `tok`, protocol/tokenizer_wire.py): any peer
that holds it serves it (`TokenizerShare`), and a peer that needs it fetches it (`fetch_tokenizer`)
from the coordinator or any other peer, checked against the sha256 the signed run spec pins.

Nothing here trusts the server: the fetcher asks for the file of the pinned hash, takes at most
`MAX_TOKENIZER_BYTES`, and keeps the bytes only if their sha256 is the pinned one; a server that sends
other bytes is named in a one-sentence error and the next candidate is asked. The chunks of one file
are asked for `PARALLEL` at a time, so a far peer's round trips overlap (64 chunks at 100 ms: ~1 s).

Works over any `request(peer, kind, body, timeout)` (a `MessageLink`'s, or `Transport.request`).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from protocol.tokenizer_wire import (
    CHUNK_BYTES,
    KIND_TOKENIZER,
    MAX_TOKENIZER_BYTES,
    TokenizerChunk,
    TokenizerRequest,
    decode_tokenizer_chunk,
    decode_tokenizer_request,
    encode_tokenizer_chunk,
    encode_tokenizer_request,
    n_chunks,
)
from protocol.wire import WireError

from .corpus import DataError

__all__ = ["PARALLEL", "TokenizerFetchError", "TokenizerShare", "fetch_tokenizer"]

log = logging.getLogger(__name__)

PARALLEL = 8
Request = Callable[[str, str, bytes, float], Awaitable[bytes]]  # (peer, kind, body, timeout) -> reply body
# may this sender, with the ticket its request carries (b"" for none), be served (a private swarm's ticket holders)
Admitted = Callable[[str, bytes], Awaitable[bool]]


class TokenizerFetchError(DataError):
    """No candidate gave the run's tokenizer; the message says why in one sentence."""


class TokenizerShare:
    """Serves one tokenizer file (its bytes, held in memory: a few MB) to the peers of run `run`."""

    def __init__(self, run: str, data: bytes, admitted: Admitted | None = None) -> None:
        if len(data) > MAX_TOKENIZER_BYTES:
            raise DataError(f"a tokenizer file of {len(data)} bytes is over the {MAX_TOKENIZER_BYTES} a peer serves.")
        self.run, self.data, self.admitted = run, bytes(data), admitted
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        self.served = 0  # chunks sent, for tests and logs

    async def on_request(self, body: bytes, sender: str) -> bytes:
        """A chunk of the file; a refusal (raised, so the transport replies with its sentence) for a
        sender a private swarm does not admit, another run, another file or a chunk past the end."""
        req = decode_tokenizer_request(body, self.run)
        if self.admitted is not None and not await self.admitted(sender, req.ticket):
            raise WireError("this private swarm serves its tokenizer to ticket holders only.")
        if req.sha256 != self.sha256:
            raise WireError(f"this peer holds the tokenizer of sha256 {self.sha256[:12]}, not {req.sha256[:12]}.")
        if req.index >= n_chunks(len(self.data)):
            raise WireError("the chunk index is past the end of the tokenizer file.")
        self.served += 1
        part = self.data[req.index * CHUNK_BYTES:(req.index + 1) * CHUNK_BYTES]
        return encode_tokenizer_chunk(TokenizerChunk(len(self.data), part))


async def _fetch_from(request: Request, peer: str, run: str, sha256: str, timeout: float, ticket: bytes) -> bytes:
    async def chunk(i: int, size: int | None) -> TokenizerChunk:
        body = encode_tokenizer_request(TokenizerRequest(run, sha256, i, ticket))
        reply = await request(peer, KIND_TOKENIZER, body, timeout)
        got = decode_tokenizer_chunk(reply)
        want = min(CHUNK_BYTES, max(0, got.size - i * CHUNK_BYTES))  # the last chunk is shorter
        if (size is not None and got.size != size) or len(got.data) != want:
            raise TokenizerFetchError(f"peer {peer[-8:]} sent a malformed chunk {i} of the tokenizer.")
        return got

    first = await chunk(0, None)
    gate = asyncio.Semaphore(PARALLEL)

    async def gated(i: int) -> bytes:
        async with gate:
            return (await chunk(i, first.size)).data

    rest = await asyncio.gather(*(gated(i) for i in range(1, n_chunks(first.size))))
    data = b"".join([first.data, *rest])
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise TokenizerFetchError(f"peer {peer[-8:]} sent a tokenizer whose sha256 is {digest[:12]}, not the "
                                  f"{sha256[:12]} the signed run spec pins, so it was discarded.")
    return data


async def fetch_tokenizer(request: Request, peers: Sequence[str], run: str, sha256: str,
                          timeout: float = 30.0, ticket: bytes = b"") -> bytes:
    """The bytes of the tokenizer file of `sha256` from the first of `peers` that serves them whole
    and right (`ticket`: this peer's admission ticket, for a private swarm); TokenizerFetchError (one
    sentence naming each peer's failure) if none does."""
    problems = []
    for peer in dict.fromkeys(peers):
        try:
            data = await _fetch_from(request, peer, run, sha256, timeout, ticket)
        except asyncio.CancelledError:
            raise
        except TokenizerFetchError as e:
            log.warning("%s", e)
            problems.append(str(e).rstrip("."))
        except Exception as e:  # a refusal, a timeout, a peer gone: ask the next one
            problems.append(f"peer {peer[-8:]}: {str(e).rstrip('.')}")
        else:
            log.info("fetched the run's tokenizer (%d bytes, sha256 %s) from %s", len(data), sha256[:12], peer[-8:])
            return data
    why = "; ".join(problems) if problems else "no peer to ask"
    raise TokenizerFetchError(f"no peer of the swarm gave this run's tokenizer (sha256 {sha256[:12]}): {why}.")

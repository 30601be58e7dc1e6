"""Tokenizer messages (kind `tok`): the run's tokenizer file, fetched in chunks from a peer that holds
it (the coordinator, or any peer with the run's prepared token folder; peer/data/tokenizer_share.py).

The run spec pins the file by its sha256 (`extra["tokens"]["tokenizer_sha256"]`, peer/data/run_tokens.py),
so the fetcher needs to trust no server: it asks for the file of that hash and checks what it got.

Maps (short keys), validated on the way in like wire.py:

    TokenizerRequest  {k: "tok", r: run, h: sha256 hex of the file asked for, i: chunk index,
                       t: the asker's admission ticket (bytes, empty in a public swarm: a private swarm serves
                          ticket holders only, and a head asks before its announcement carries its ticket)}
    TokenizerChunk    {k: "tokc", z: the whole file's bytes, d: chunk i (bytes)}

A chunk is `CHUNK_BYTES` long, the last one shorter, so a file of z bytes has ceil(z / CHUNK_BYTES)
chunks (one, empty, for z = 0). 32 KiB: a reply stays far below the smallest frame any peer of a run
accepts (the coordinator's, 64 KiB plus the basis), and a 2 MB tokenizer (vocabulary 32k) is 64 chunks.
"""
from __future__ import annotations

from dataclasses import dataclass

import msgpack

from protocol.fields import check_run, int_field, same, unpack_map
from protocol.wire import need

__all__ = ["CHUNK_BYTES", "KIND_TOKENIZER", "MAX_TOKENIZER_BYTES", "TokenizerChunk", "TokenizerRequest",
           "decode_tokenizer_chunk", "decode_tokenizer_request", "encode_tokenizer_chunk", "encode_tokenizer_request",
           "n_chunks"]

KIND_TOKENIZER = "tok"  # the run's tokenizer file, peer -> a peer that holds it (beside protocol/wire.py's kinds)
_CHUNK = "tokc"
CHUNK_BYTES = 1 << 15
# A tokenizer.json of a 256k vocabulary is ~20 MB; anything past this is not a tokenizer.
MAX_TOKENIZER_BYTES = 64 << 20


MAX_TICKET_BYTES = 512  # swarm/trust/admission.py's bound on a ticket


@dataclass(frozen=True)
class TokenizerRequest:
    run: str
    sha256: str
    index: int
    ticket: bytes = b""


@dataclass(frozen=True)
class TokenizerChunk:
    size: int  # the whole file's bytes
    data: bytes


def n_chunks(size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    return max(1, -(-size // chunk_bytes))


def _sha(v: object) -> str:
    need(isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v),
         "a tokenizer's sha256 must be 64 lowercase hex digits.")
    return v


def encode_tokenizer_request(r: TokenizerRequest) -> bytes:
    return msgpack.packb({"k": KIND_TOKENIZER, "r": r.run, "h": r.sha256, "i": r.index, "t": r.ticket})


def decode_tokenizer_request(data: bytes, run: str) -> TokenizerRequest:
    d = unpack_map(data, 4096, "a tokenizer request", max_bin=MAX_TICKET_BYTES)
    need(same(d.get("k"), KIND_TOKENIZER), "not a tokenizer request.")
    check_run(d, run, "the tokenizer request")
    ticket = d.get("t", b"")
    need(isinstance(ticket, bytes), "a tokenizer request's ticket must be bytes.")
    return TokenizerRequest(run, _sha(d.get("h")),
                            int_field(d, "i", "a tokenizer chunk index", n_chunks(MAX_TOKENIZER_BYTES)), ticket)


def encode_tokenizer_chunk(c: TokenizerChunk) -> bytes:
    return msgpack.packb({"k": _CHUNK, "z": c.size, "d": c.data})


def decode_tokenizer_chunk(data: bytes) -> TokenizerChunk:
    d = unpack_map(data, CHUNK_BYTES + 256, "a tokenizer chunk", max_bin=CHUNK_BYTES)
    need(same(d.get("k"), _CHUNK), "not a tokenizer chunk.")
    chunk = d.get("d")
    need(isinstance(chunk, bytes), "a tokenizer chunk's d must be bytes.")
    return TokenizerChunk(int_field(d, "z", "a tokenizer's size", MAX_TOKENIZER_BYTES + 1), chunk)

"""Coordinator-signed records between peers (kind `rec`, protocol/record_wire.py): every peer re-serves what it
holds (`RecordShare`: the signed run spec it joined with, the newest leader lease it read, the basis updates it
follows, the heads' signed work records; `held.py`), and a peer that finds none of them in the DHT asks the peers
it reaches (`PeerRecords`).

Why: the coordinator keeps its records alive by publishing them again (the run spec lives 60 s in the DHT, a lease
1 h, a basis update 100 min: `docs/security.md`, "Without any coordinator"); with every coordinator down for
longer, a newcomer would find no spec to join with, no basis chain to check a state against and no lease to know
the leader by. The records themselves need no coordinator: each carries the swarm key's signature, and the asker
checks it (`held.py`), pinned with --swarm-key when given. So the swarm keeps taking newcomers for as long as one
peer that holds the records stays.

Who is asked (`candidates`, given by the caller): the peers of --initial-peers, then the peers this node reaches
(before the run is known, p2pd's connections; after, the peers announced for the run's stages), at most
`MAX_ASKED`, all at once, each within `ASK_TIMEOUT_S`. A peer is asked for one kind of record at most every
`ASK_EVERY_S`: a reader polls the DHT far more often than that. The first record taken from a peer of each kind
is logged in one line that says why (no coordinator is up).

Who is served: any admitted asker (`admitted`: a public swarm admits everyone; a private one, a peer its DHT view
admits or one whose request carries a valid ticket, as the tokenizer is served). A request over
`MAX_REQUEST_BYTES` is refused by the transport before its body is read; a malformed one, or one from a stranger
of a private swarm, gets an `ErrorReply` that says why.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import msgpack

from protocol.record_wire import (
    KIND_RECORDS,
    RecordReply,
    RecordRequest,
    decode_record_reply,
    decode_record_request,
    encode_record_reply,
    encode_record_request,
    reply_limit,
)
from protocol.wire import ErrorReply, WireError, encode_message
from swarm.trust.admission import AdmissionPolicy

from .envelope import Envelope
from .held import HeldRecords, lease_from_peer, spec_from_peer
from .records import LeaderLease, RecordError, SignedRunSpec

__all__ = ["ASK_EVERY_S", "MAX_ASKED", "PeerRecords", "RecordShare"]

log = logging.getLogger(__name__)

MAX_ASKED = 8
ASK_TIMEOUT_S = 5.0
ASK_EVERY_S = 5.0
NOT_ADMITTED = "this private swarm re-serves its coordinator's records to ticket holders only (swarm admit)."
Request = Callable[[str, str, bytes, float], Awaitable[bytes]]  # (peer, kind, body, timeout) -> reply body
Admitted = Callable[[str, bytes], Awaitable[bool]]  # (sender, the ticket its request carries) -> may it be served


class RecordShare:
    """Serves what `held` holds to whoever `admitted` lets in (None: everyone)."""

    def __init__(self, held: HeldRecords, admitted: Admitted | None = None) -> None:
        self.held, self.admitted = held, admitted
        self.served = 0

    async def on_request(self, body: bytes, sender: str) -> bytes:
        try:
            req = decode_record_request(body)
        except WireError as e:
            return encode_message(ErrorReply(str(e)))
        if self.admitted is not None and not await self.admitted(sender, req.ticket):
            return encode_message(ErrorReply(NOT_ADMITTED))
        self.served += 1
        return encode_record_reply(self.held.reply(req.want, req.run, req.version))


class PeerRecords:
    """Asks peers for the records the DHT no longer holds; each result is checked against the swarm key."""

    def __init__(self, request: Request, candidates: Callable[[], Awaitable[list[str]]], ticket: bytes = b"",
                 basis_bytes: int = 0, timeout: float = ASK_TIMEOUT_S, every_s: float = ASK_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.request, self.candidates, self.ticket = request, candidates, ticket
        self.basis_bytes, self.timeout, self.every_s, self.clock = basis_bytes, timeout, every_s, clock
        self._asked: dict[str, float] = {}  # what -> when peers were last asked for it
        self._told: set[str] = set()  # what was logged as taken from a peer

    def _due(self, what: str) -> bool:
        now = self.clock()
        if now - self._asked.get(what, float("-inf")) < self.every_s:
            return False
        self._asked[what] = now
        return True

    def _took(self, what: str, peer: str, detail: str) -> None:
        if what not in self._told:
            self._told.add(what)
            log.info("got the %s from peer %s (%s): the DHT holds none, so no coordinator is up; peers re-serve the "
                     "records it signed, checked against the swarm key", what, peer[-8:], detail)

    async def _ask(self, peer: str, req: RecordRequest) -> RecordReply | None:
        try:
            reply = await self.request(peer, KIND_RECORDS, encode_record_request(req), self.timeout)
            return decode_record_reply(reply, reply_limit(req.want, self.basis_bytes))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a refusal, a peer gone, one that does not serve records: ask the others
            log.debug("peer %s gave no %s: %s", peer[-8:], req.want, e)
            return None

    async def _ask_all(self, req: RecordRequest, first: list[str] | None = None) -> list[tuple[str, RecordReply]]:
        try:
            peers = list(dict.fromkeys([*(first or []), *await self.candidates()]))[:MAX_ASKED]
        except Exception as e:  # the DHT may be slow: nobody to ask this time
            log.debug("no peers to ask for the %s: %s", req.want, e)
            return []
        replies = await asyncio.gather(*(self._ask(p, req) for p in peers))
        return [(p, r) for p, r in zip(peers, replies) if r is not None]

    async def run_spec(self, trusted_key: bytes | None = None) -> SignedRunSpec | None:
        """The run spec the asked peers hold (pinned to `trusted_key` if given), or None (none, or not due);
        RecordError if they hold several (unpinned: several keys or runs) or none by the pinned key."""
        if not self._due("spec"):
            return None
        found: dict[tuple[bytes, str], tuple[str, SignedRunSpec]] = {}
        for peer, reply in await self._ask_all(RecordRequest("spec", ticket=self.ticket)):
            if not reply.record:
                continue
            try:
                signed = spec_from_peer(reply.record)
            except RecordError as e:
                log.warning("peer %s sent a run spec that is refused: %s", peer[-8:], e)
                continue
            found.setdefault((signed.public_key, signed.run_hash), (peer, signed))
        if trusted_key is not None:
            mismatched = [s for (k, _), (_, s) in found.items() if k != bytes(trusted_key)]
            found = {k: v for k, v in found.items() if k[0] == bytes(trusted_key)}
            if not found and mismatched:
                mismatched[0].verify(trusted_key)  # raises with the signer's and the trusted fingerprints
        if len(found) > 1:
            runs = ", ".join(sorted(f"{run} by key {s.fingerprint}" for (_, run), (_, s) in found.items()))
            raise RecordError(f"the peers asked hold several run specs ({runs}); pin the coordinator's key with "
                              f"--swarm-key, or join through a peer of the run you mean.")
        if not found:
            return None
        peer, signed = next(iter(found.values()))
        self._took("run spec", peer, f"run {signed.run_hash}, signed by {signed.fingerprint}")
        return signed

    async def lease(self, run_hash: str, policy: AdmissionPolicy) -> tuple[Envelope, LeaderLease] | None:
        """The highest-term lease of `run_hash` the asked peers hold that the adopted key (`policy`) signed, or
        None (none, or not due)."""
        if not self._due("lease"):
            return None
        best: tuple[str, Envelope, LeaderLease] | None = None
        for peer, reply in await self._ask_all(RecordRequest("lease", run_hash, ticket=self.ticket)):
            if not reply.record:
                continue
            try:
                env, lease = lease_from_peer(reply.record, run_hash, policy)
            except RecordError as e:
                log.warning("peer %s sent a leader lease that is refused: %s", peer[-8:], e)
                continue
            if best is None or lease.term > best[2].term:
                best = (peer, env, lease)
        if best is None:
            return None
        self._took("leader lease", best[0], f"term {best[2].term}")
        return best[1], best[2]

    async def bases(self, run_hash: str, check: Callable[[int, bytes], bool]) -> dict[int, bytes]:
        """Every basis update of `run_hash` the asked peers hold that `check(version, bytes)` accepts (the reader's
        signature check), by version; {} when none (or not due). Each version is taken from the first peer that
        lists it and sends one that passes."""
        if not self._due("basis"):
            return {}
        listed = [(p, r.versions) for p, r in await self._ask_all(RecordRequest("basis", run_hash,
                                                                                  ticket=self.ticket))]
        out: dict[int, bytes] = {}
        for version in sorted({v for _, versions in listed for v in versions}):
            for peer in [p for p, versions in listed if version in versions]:
                reply = await self._ask(peer, RecordRequest("basis", run_hash, version, self.ticket))
                if reply is not None and reply.record and check(version, reply.record):
                    out[version] = reply.record
                    break
                log.warning("peer %s lists basis version %d but gave none that is the swarm key's", peer[-8:],
                            version)
        if out:
            self._took("basis updates", next(p for p, versions in listed if max(out) in versions),
                       f"versions {min(out)}-{max(out)}")
        return out

    async def work(self, run_hash: str, heads: list[str], check: Callable[[bytes], bool]) -> list[bytes]:
        """The heads' signed work records of `run_hash` that the asked peers hold (`heads`, the lease's, are asked
        first: they signed them) and `check` (the reader's: the signature, a head the lease names) accepts; [] when
        none (or not due)."""
        if not self._due("work"):
            return []
        out: dict[bytes, None] = {}
        for peer, reply in await self._ask_all(RecordRequest("work", run_hash, ticket=self.ticket), heads):
            try:
                records = msgpack.unpackb(reply.record, raw=False) if reply.record else []
            except Exception:  # msgpack raises several kinds on bytes that are not its own
                records = None
            if not isinstance(records, list) or not all(isinstance(r, bytes) for r in records):
                log.warning("peer %s sent work records that do not decode", peer[-8:])
                continue
            taken = [r for r in records if check(r)]
            if len(taken) < len(records):
                log.warning("peer %s sent %d work records that are not a lease head's; ignored", peer[-8:],
                            len(records) - len(taken))
            out.update(dict.fromkeys(taken))
        return list(out)

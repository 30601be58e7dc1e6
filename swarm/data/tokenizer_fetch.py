"""The run's tokenizer over the network: the coordinator and every peer that holds the file serve it
(kind `tok`), and a peer whose token folder lacks it fetches it from them (peer/data/tokenizer_share.py:
chunks, the signed run spec's sha256 checked) and keeps it in the folder, so that it serves it in turn.

Who is asked, in order: the coordinators (the seat's holder, then any other with a live claim: a standby
started on a copy of the run's folder holds it too; with no claim ever read, the spec's `coordinator_peer`,
which holds the folder the run was started on), then up to `MAX_ASKED` peers that announce a stage of the
run. Nothing is downloaded from outside the swarm.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from peer.data.corpus import DataError
from peer.data.run_tokenizer import find_run_tokenizer, keep_tokenizer, run_tokenizer_sha256, token_folders
from peer.data.tokenizer_share import TokenizerShare, fetch_tokenizer
from protocol.spec import RunSpec
from protocol.tokenizer_wire import KIND_TOKENIZER
from swarm.dht import ActiveCoordinator
from swarm.trust.admission import AdmissionError

__all__ = ["MAX_ASKED", "candidates", "fetch_run_tokenizer", "share_run_tokenizer"]

log = logging.getLogger(__name__)

MAX_ASKED = 8
FETCH_TIMEOUT_S = 20.0


async def candidates(spec: RunSpec, sdht, own_id: str | None = None) -> list[str]:
    """The peers to ask for the tokenizer: the coordinators (`ActiveCoordinator.peer_ids`), then peers announced
    for the run's stages."""
    found: list = await ActiveCoordinator(sdht, spec.run_hash, spec.extra.get("coordinator_peer") or "").peer_ids()
    try:
        announced = await sdht.all_stage_peers(spec.run_hash, spec.n_stages)
        found += [a.peer_id for s in sorted(announced) for a in announced[s]]
    except Exception as e:  # the DHT may be slow or empty: the coordinator alone is still worth asking
        log.debug("could not list the run's peers: %s", e)
    return [p for p in dict.fromkeys(found) if isinstance(p, str) and p and p != own_id][:MAX_ASKED]


async def fetch_run_tokenizer(spec: RunSpec, transport, sdht, own_id: str | None = None) -> bytes:
    """The run's tokenizer file's bytes from the swarm (TokenizerFetchError, one sentence, if no peer gives it)."""
    sha = run_tokenizer_sha256(spec)
    if sha is None:
        raise DataError("this run trains on bytes: it has no tokenizer file to fetch.")
    ticket = getattr(sdht, "ticket", None)  # a private swarm's: asked before our announcement carries it
    return await fetch_tokenizer(transport.request, await candidates(spec, sdht, own_id), spec.run_hash, sha,
                                 FETCH_TIMEOUT_S, ticket.to_bytes() if ticket is not None else b"")


async def share_run_tokenizer(spec: RunSpec, transport, sdht, folder: str | os.PathLike[str] | None = None,
                              own_id: str | None = None, fetch: bool = True) -> Path | None:
    """Serve the run's tokenizer if this machine holds it (in `folder`, a `--tokens DIR`, or the recorded
    token folder). A peer that holds the run's token folder but not the tokenizer fetches it first (with
    `fetch`) and keeps it there. Returns the file served, or None: a run on bytes, no copy here and no
    token folder to keep one in, or a fetch that failed (logged: training reads token ids and goes on)."""
    sha = run_tokenizer_sha256(spec)
    if sha is None:
        return None
    folders = token_folders(spec, folder)
    path = find_run_tokenizer(spec, folders)  # DataError for a tokenizer.json of another hash
    data = path.read_bytes() if path is not None else None
    if data is None and fetch and folders:
        try:
            data = await fetch_run_tokenizer(spec, transport, sdht, own_id)
        except DataError as e:
            log.warning("%s", e)
            return None
        try:
            path = keep_tokenizer(data, sha, folders[0])
            log.info("kept the run's tokenizer in %s", path)
        except OSError as e:  # a read-only copy of the folder: serve it from memory all the same
            log.warning("could not write the run's tokenizer into %s (%s); serving it from memory", folders[0], e)
    if data is None:
        return None
    await transport.serve(KIND_TOKENIZER, TokenizerShare(spec.run_hash, data, admits(sdht)).on_request)
    return path


def admits(sdht):
    """Who may have the tokenizer: whom this peer's DHT view admits (a public swarm: everyone), or a sender
    whose request carries a valid ticket of this swarm (a private swarm's head asks before it announces)."""
    async def admitted(sender: str, ticket: bytes) -> bool:
        if await sdht.admitted(sender):
            return True
        if not ticket:
            return False
        try:
            sdht.admission.check(sender, ticket)  # the swarm key's signature for this sender, not expired
        except AdmissionError:
            return False
        return True
    return admitted

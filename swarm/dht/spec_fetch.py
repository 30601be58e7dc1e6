"""The run spec a reader trusts, wherever it is found: the DHT's copy or, with none there (no coordinator up for
longer than the spec lives there), a peer's re-served copy (`record_share.py`), both checked the same way.

One copy of the checks for everyone who reads a spec to act on it: a peer joining (`swarm/node.py`), a standby
coordinator (`swarm/coordinator/run.py`), and the operator's tools (`swarm status`, the dashboard, `swarm unban`).
`read_spec` looks once; `fetch_spec` looks until a deadline, as a joiner waits for a coordinator coming up.

The checks: a pinned key (`--swarm-key`, a public key or its 8-byte fingerprint) must be the signer's; the spec
must name the key that signed it as its coordinator key, if it names one. Whatever is read is held in `sdht.held`
to be re-served in turn.
"""
from __future__ import annotations

import asyncio
import logging
import time

from protocol.spec import RunSpec

from .record_share import PeerRecords
from .records import SignedRunSpec

__all__ = ["JoinError", "fetch_spec", "read_spec"]

log = logging.getLogger(__name__)


class JoinError(RuntimeError):
    """This peer cannot join the swarm (or a tool cannot read it); the message says what to do."""


def _pinned(trusted_key: str | None) -> tuple[bytes | None, bytes | None]:
    """(the pinned bytes, the public key to ask the DHT for: None when only a fingerprint is pinned)."""
    try:
        pinned = bytes.fromhex(trusted_key) if trusted_key else None
    except ValueError:
        raise JoinError("--swarm-key must be the coordinator's key fingerprint or public key, in hex.") from None
    return pinned, pinned if pinned is not None and len(pinned) > 8 else None  # a fingerprint is 8 bytes


async def read_spec(sdht, trusted_key: str | None, peers: PeerRecords | None = None
                    ) -> tuple[SignedRunSpec, RunSpec] | None:
    """The signed run spec and the spec, from the DHT or else from `peers`; None if neither holds one (or the peers
    were asked too recently: `PeerRecords` asks each kind at most every few seconds). JoinError if the spec found
    is not the pinned key's or names another coordinator key; RecordError if several keys' specs are found."""
    pinned, key = _pinned(trusted_key)
    signed = await sdht.fetch_run_spec(key)
    if signed is None and peers is not None:
        signed = await peers.run_spec(key)
    if signed is None:
        return None
    if pinned is not None and key is None and signed.fingerprint != trusted_key.lower():
        raise JoinError(f"the run spec is signed by key {signed.fingerprint}, not by the pinned {trusted_key}.")
    spec = RunSpec.from_json(signed.spec_json)
    if spec.coordinator_key and spec.coordinator_key != signed.public_key.hex():
        raise JoinError("the run spec names a coordinator key other than the one that signed it; "
                        "this swarm is misconfigured or under attack.")
    sdht.held.spec = signed
    return signed, spec


async def fetch_spec(sdht, trusted_key: str | None, timeout: float, peers: PeerRecords | None = None) -> RunSpec:
    """The run spec (`read_spec`), polled for until `timeout` while the coordinator comes up; JoinError after it."""
    deadline = time.monotonic() + timeout
    _pinned(trusted_key)  # a malformed key fails at once, not at the deadline
    while True:
        found = await read_spec(sdht, trusted_key, peers)
        if found is not None:
            signed, spec = found
            log.info("joined run %s (%s, compute dtype %s from its run spec), signed by %s", spec.run_hash, spec.name,
                     spec.dtype, signed.fingerprint)
            return spec
        if time.monotonic() > deadline:
            raise JoinError(f"no run spec found in the DHT{' or at the peers asked' if peers else ''} after "
                            f"{timeout:g} s; check --initial-peers (the address of the coordinator or of a peer of the "
                            f"swarm) and that the coordinator or that peer is running.")
        await asyncio.sleep(0.5)  # poll the DHT for the spec while the coordinator comes up

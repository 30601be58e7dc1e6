"""`SwarmDHT`: reads and writes the swarm's records (`records.py`) over a started `hivemind.DHT`.

Every DHT call here is made with `return_future=True` and awaited, so the caller's asyncio
loop never blocks on the DHT process. Whatever comes back is parsed through the record
dataclasses; an entry that does not fit is skipped and counted, never trusted.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Callable

with warnings.catch_warnings():
    # hivemind's import runs torch.jit.script, which warns that it is deprecated; only that.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    import hivemind
    from hivemind.utils import get_dht_time

from swarm.keys import SigningKey

from .records import RUN_KEY, RecordError, SignedRunSpec, StageAnnouncement, _require, basis_key, stage_key

__all__ = ["SwarmDHT"]

log = logging.getLogger(__name__)


async def _visible_maddrs(_dht: hivemind.DHT, node) -> list[str]:
    # Runs inside the DHT process (via run_coroutine), hence module-level and picklable.
    return [str(m) for m in await node.get_visible_maddrs()]


class SwarmDHT:
    """The swarm's records over a started `hivemind.DHT` (not owned: stop it with `stop_dht`)."""

    def __init__(self, dht: hivemind.DHT) -> None:
        self.dht = dht
        self.skipped_records = 0  # malformed or badly signed entries seen, for health reports

    def _skip(self, where: str, problem: str) -> None:
        self.skipped_records += 1
        log.debug("skipped a record under %s: %s", where, problem)

    async def publish_run_spec(self, spec_json: str, key: SigningKey, ttl: float) -> SignedRunSpec:
        record = SignedRunSpec.create(spec_json, key)
        stored = await self.dht.store(
            RUN_KEY, record.to_record(), get_dht_time() + ttl, subkey=record.fingerprint, return_future=True
        )
        if not stored:
            raise RuntimeError("the DHT did not store the run spec (no node answered, or it holds a later one).")
        return record

    async def fetch_run_spec(self, trusted_key: bytes | None = None) -> SignedRunSpec | None:
        """The published run spec, None if there is none; RecordError if none can be trusted."""
        found = await self.dht.get(RUN_KEY, latest=True, return_future=True)
        if found is None or (isinstance(found.value, dict) and not found.value):
            return None
        if not isinstance(found.value, dict):
            raise RecordError("the run spec entry in the DHT is not a set of signed records.")
        valid, problems = [], []
        for subkey, item in found.value.items():
            try:
                record = SignedRunSpec.from_record(item.value)
                record.verify()
                _require(subkey == record.fingerprint, "the run spec is filed under another key's fingerprint.")
            except RecordError as e:
                self._skip(RUN_KEY, str(e))
                problems.append(str(e))
                continue
            valid.append(record)
        if trusted_key is not None:
            for record in valid:
                if record.public_key == bytes(trusted_key):
                    return record
            if valid:
                valid[0].verify(trusted_key)  # raises with the signer's and the trusted fingerprints
        elif len(valid) == 1:
            return valid[0]
        elif valid:
            keys = ", ".join(sorted(r.fingerprint for r in valid))
            raise RecordError(f"several keys ({keys}) publish a run spec; pin the coordinator's key with trusted_key.")
        raise RecordError(problems[0] if problems else "the DHT holds no run spec signed by the trusted key.")

    async def announce(self, ann: StageAnnouncement, ttl: float) -> bool:
        """Publish `ann` for `ttl` seconds; False if no DHT node stored it."""
        key = stage_key(ann.run_hash, ann.stage)
        return bool(
            await self.dht.store(key, ann.to_record(), get_dht_time() + ttl, subkey=ann.peer_id, return_future=True)
        )

    async def stage_peers(self, run_hash: str, stage: int) -> list[StageAnnouncement]:
        """Unexpired, well-formed announcements for one stage, sorted by peer id."""
        key = stage_key(run_hash, stage)
        found = await self.dht.get(key, latest=True, return_future=True)
        if found is None:
            return []
        if not isinstance(found.value, dict):
            self._skip(key, "the entry is a plain value, not a map of peers.")
            return []
        now, peers = get_dht_time(), []
        for subkey, item in found.value.items():
            if item.expiration_time <= now:
                continue
            try:
                ann = StageAnnouncement.from_record(item.value)
                _require(ann.peer_id == subkey, "the announcement is filed under another peer's id.")
                _require((ann.run_hash, ann.stage) == (run_hash, stage), "the announcement is filed under another key.")
            except (RecordError, TypeError) as e:
                self._skip(key, str(e))
                continue
            peers.append(ann)
        return sorted(peers, key=lambda a: a.peer_id)

    async def all_stage_peers(self, run_hash: str, n_stages: int) -> dict[int, list[StageAnnouncement]]:
        found = await asyncio.gather(*(self.stage_peers(run_hash, s) for s in range(n_stages)))
        return dict(enumerate(found))

    async def heartbeat(self, make_announcement: Callable[[], StageAnnouncement], ttl: float, period: float) -> None:
        """Re-announce every `period` seconds until cancelled, so the record outlives us by at most `ttl`."""
        if not 0 < period < ttl:
            raise ValueError(f"the heartbeat period ({period} s) must be positive and shorter than the ttl ({ttl} s).")
        while True:
            try:
                if not await self.announce(make_announcement(), ttl):
                    log.warning("heartbeat: the DHT did not store this announcement; retrying in %g s", period)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a transient DHT failure must not end the heartbeat
                log.warning("heartbeat failed (%s: %s); retrying in %g s", type(e).__name__, e, period)
            await asyncio.sleep(period)

    async def publish_basis(self, run_hash: str, version: int, update: bytes, ttl: float) -> bool:
        """Store one signed basis update (bytes of protocol.basis_update.encode_update)."""
        return bool(await self.dht.store(basis_key(run_hash), update, get_dht_time() + ttl, subkey=version,
                                         return_future=True))

    async def fetch_bases(self, run_hash: str) -> dict[int, bytes]:
        """Every stored basis update by version, unverified (the reader checks the signature)."""
        found = await self.dht.get(basis_key(run_hash), latest=True, return_future=True)
        if found is None or not isinstance(found.value, dict):
            return {}
        out = {}
        for subkey, item in found.value.items():
            if isinstance(subkey, int) and isinstance(item.value, bytes):
                out[subkey] = item.value
            else:
                self._skip(basis_key(run_hash), "a basis entry is not (int version -> bytes).")
        return out

    async def visible_maddrs(self) -> list[str]:
        return await self.dht.run_coroutine(_visible_maddrs, return_future=True)

"""`CheckpointKeeper`: the coordinator's own copy of every stage's newest vouched snapshots, on
disk (`swarm coordinator --checkpoint-dir DIR`), served to a peer that restores a stage when no
peer holds them any more (issue 19: a snapshot is held by two peers of other stages "and by the
coordinator when it has a --checkpoint-dir").

Once the coordinator vouches for the snapshots of a step (`swarm/replicas/vouched.py`), it asks
the swarm's peers, the stage's own replicas first, which snapshots of each stage they hold
(`list`), fetches the vouched one in chunks from the first that has it (`fetch_snapshot`: size
and sha256 checked), and keeps the newest `keep` per stage in memory and as files

    DIR/<run hash>/stage<s>-step<n>-<sha256>.snap     (the stage's serialised state; written atomically)

A restarted coordinator reads them back (each checked against the sha256 in its name). It
answers `list` and `chunk` requests of kind `snap` like a custodian does, and refuses offers:
it keeps only what the swarm key vouched for. A restoring peer asks it beside the live peers
(`SnapshotService.extra_holders`) and loads only a vouched snapshot, as from anyone.
"""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

from peer.runner.checkpoint import save_checkpoint
from peer.state.snapshot_store import Snapshot, SnapshotRefused, SnapshotStore
from peer.state.snapshots import NoSnapshot, fetch_snapshot, state_bound
from protocol.snapshot_wire import (
    CHUNK_BYTES,
    MAX_LISTED,
    SnapshotList,
    SnapshotRequest,
    decode_snapshot_list,
    decode_snapshot_request,
    encode_snapshot_list,
    encode_snapshot_request,
    n_chunks,
)
from protocol.spec import RunSpec
from protocol.wire import KIND_SNAPSHOT, ErrorReply, WireError, encode_message

log = logging.getLogger(__name__)

_FILE = re.compile(r"stage(\d+)-step(\d+)-([0-9a-f]{64})\.snap")


class CheckpointKeeper:
    def __init__(self, spec: RunSpec, link, holders: Callable[[int], Awaitable[list[str]]], directory: str | Path,
                 keep: int = 2, timeout: float = 120.0) -> None:
        self.spec, self.link, self.holders, self.timeout = spec, link, holders, timeout
        self.dir = Path(directory) / spec.run_hash
        self._bounds: dict[int, int] = {}
        self.store = SnapshotStore(self.max_bytes, keep)
        self._fetching: set[int] = set()
        self._tasks: set[asyncio.Task] = set()
        self._read_back()

    def max_bytes(self, stage: int) -> int:
        if stage not in self._bounds:
            self._bounds[stage] = state_bound(self.spec, stage)
        return self._bounds[stage]

    def _path(self, snap: Snapshot) -> Path:
        return self.dir / f"stage{snap.stage}-step{snap.step}-{snap.sha256}.snap"

    def _read_back(self) -> None:
        """The snapshots a previous run of this coordinator wrote, each checked against its name's sha256."""
        for path in sorted(self.dir.glob("stage*-step*-*.snap")) if self.dir.is_dir() else []:
            m = _FILE.fullmatch(path.name)
            if m is None or int(m[1]) >= self.spec.n_stages:
                continue
            try:
                self.store.put(Snapshot(int(m[1]), int(m[2]), m[3], path.read_bytes()))
            except (SnapshotRefused, OSError) as e:
                log.warning("%s is not kept: %s", path, e)
        if self.store.stages():
            log.info("holding %d stage snapshot(s) from %s", sum(len(self.store.listed(s)) for s in
                                                                  self.store.stages()), self.dir)

    # ------------------------------------------------------------------ keeping
    def on_vouched(self, step: int, hashes: dict[int, str], leader: str = "") -> None:
        """The swarm key vouched for every stage's snapshot at `step`: fetch the ones not held (in the background)."""
        task = asyncio.get_running_loop().create_task(self.fetch_all(step, hashes))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def fetch_all(self, step: int, hashes: dict[int, str]) -> list[int]:
        """Fetch each stage's vouched snapshot at `step`; returns the stages now held at that step."""
        return [s for s in sorted(hashes) if await self.fetch(s, step, hashes[s])]

    async def fetch(self, stage: int, step: int, sha256: str) -> bool:
        held = self.store.get(stage, step)
        if held is not None:
            return held.sha256 == sha256
        if not self.store.wants(stage, step) or stage in self._fetching:
            return False
        self._fetching.add(stage)
        try:
            for peer in await self.holders(stage):
                snap = await self._fetch_from(peer, stage, step, sha256)
                if snap is not None:
                    self.store.put(snap)
                    await asyncio.to_thread(self._write, snap)
                    log.info("keeping stage %d's snapshot at step %d (%.1f MB, from %s) in %s", stage, step,
                             len(snap.data) / 1e6, peer[-8:], self.dir)
                    return True
            log.warning("no peer gave stage %d's vouched snapshot at step %d", stage, step)
            return False
        finally:
            self._fetching.discard(stage)

    async def _fetch_from(self, peer: str, stage: int, step: int, sha256: str) -> Snapshot | None:
        run = self.spec.run_hash
        try:
            reply = await self.link.request(peer, KIND_SNAPSHOT, encode_snapshot_request(SnapshotRequest(run, "list",
                                                                                                         stage)),
                                            timeout=min(self.timeout, 30.0))
            info = next((i for i in decode_snapshot_list(reply, self.max_bytes(stage)).held
                         if (i.step, i.sha256) == (step, sha256)), None)
            if info is None:
                return None
            data = await fetch_snapshot(self.link, peer, run, stage, info, CHUNK_BYTES, self.timeout)
            return Snapshot(stage, step, sha256, data)
        except (NoSnapshot, SnapshotRefused) as e:
            log.info("stage %d's snapshot at step %d from %s: %s", stage, step, peer[-8:], e)
        except Exception as e:  # a peer that does not answer, or answers garbage, holds nothing usable
            log.info("%s did not say which snapshots of stage %d it holds (%s)", peer[-8:], stage, e)
        return None

    def _write(self, snap: Snapshot) -> None:
        save_checkpoint(self._path(snap), snap.data)
        held = {self._path(s).name for st in self.store.stages() for s in
                (self.store.get(st, i.step) for i in self.store.listed(st))}
        for path in self.dir.glob(f"stage{snap.stage}-step*-*.snap"):
            if path.name not in held:  # dropped from the store: older than the `keep` newest
                path.unlink(missing_ok=True)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ serving
    async def on_request(self, body: bytes, sender: str) -> bytes:
        try:
            largest = max(self.max_bytes(s) for s in range(self.spec.n_stages))
            req = decode_snapshot_request(body, self.spec.run_hash, self.spec.n_stages, largest)
        except WireError as e:
            return encode_message(ErrorReply(str(e)))
        if req.op == "list":
            return encode_snapshot_list(SnapshotList(0, self.store.listed(req.stage)[:MAX_LISTED]))
        if req.op == "offer":
            return encode_message(ErrorReply("the coordinator keeps only the snapshots the swarm key vouched for, "
                                             "and fetches them itself."))
        snap = self.store.get(req.stage, req.step)
        if snap is None:
            return encode_message(ErrorReply("no snapshot of that stage and step is held here."))
        if req.index >= n_chunks(len(snap.data), CHUNK_BYTES):
            return encode_message(ErrorReply("the chunk index is past the end of the snapshot."))
        return snap.data[req.index * CHUNK_BYTES:(req.index + 1) * CHUNK_BYTES]

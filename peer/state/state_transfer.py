"""State transfer: a replica that joins a stage downloads the stage's state from a live one.

The donor takes a snapshot of `StageRunner.state_dict()` on its worker thread (so between
two of its optimizer steps: the weights, optimizer moments, step, basis and statistic at the
start of the step in progress), serialises it once and serves it in chunks; the joiner checks
the snapshot's sha256, that it is this run's and this stage's state, and that its basis is the
one the coordinator signed for that version, then loads it. While the joiner downloads, the
swarm goes on: the donor forwards it every reduced gradient from the snapshot's step on
(`FollowForwarder.follow_from`, step/follow_forward.py), the joiner applies them in order, and once it takes part in a
reduce itself it is an ordinary replica. Its parameters then equal its donor's bit for bit:
the same state plus the same summed gradients through the same optimizer step.

Snapshots are loaded with `torch.load(weights_only=True)`: bytes from a peer never run code.
"""
from __future__ import annotations

import asyncio
import io
import logging
import time
from collections.abc import Callable

import torch

from peer.commit.commit import StepCommit
from peer.daemon.daemon import StageDaemon
from peer.runner.stage import StageError
from peer.runner.state_hash import state_bytes
from protocol.state_wire import (
    STATE_CHUNK_BYTES,
    FollowUpdate,
    StateMeta,
    StateRequest,
    decode_state_meta,
    decode_state_request,
    encode_state_meta,
    encode_state_request,
    sha256_hex,
)
from protocol.wire import KIND_STATE, WireError, refusal_reason

log = logging.getLogger(__name__)

SNAPSHOT_TTL_S = 300.0  # a snapshot is served this long after it was taken
MAX_QUEUED = 64  # reduced gradients a joiner holds while it loads (it downloads again if it falls further behind)
MAX_SNAPSHOTS = 2
HASHED_WAIT_S = 60.0  # how long a donor waits for a step whose state hash the swarm records


class StateError(RuntimeError):
    """A state download failed or its content cannot be trusted; the text says which."""


def load_state_bytes(data: bytes) -> dict:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


class StateService:
    """Serves this replica's state to joiners; registers each as a follower of its reduces."""

    def __init__(self, daemon: StageDaemon, commit: StepCommit) -> None:
        self.daemon, self.commit, self.runner = daemon, commit, daemon.runner
        self._snapshots: dict[int, tuple[bytes, float]] = {}
        self.served = 0
        # serve a joiner only a state at a step whose hash the replicas report (set where the swarm records those
        # hashes: a run with a coordinator), so that the joiner can check it against the vouched one
        self.hashed_only = False
        # its owner: this replica is downloading the stage's state itself (left behind): it has none to give, and a
        # wait for its next hashed step would cost the asker HASHED_WAIT_S, since it is not stepping
        self.catching_up: Callable[[], bool] = lambda: False

    async def start(self) -> None:
        await self.daemon.link.serve(KIND_STATE, self._on_request)

    def _snapshot(self, follower: str, every: int = 1) -> tuple[int, bytes] | None:
        """Worker thread: the state between two steps, and `follower` registered in the same breath;
        None if the stage is not at a multiple of `every` steps."""
        if every > 1 and self.runner.step % every:
            return None
        self.commit.forwarder.follow_from(follower, self.runner.step)
        return self.runner.step, state_bytes(self.runner.state_dict())

    async def _hashed_snapshot(self, follower: str) -> tuple[int, bytes] | None:
        """The state at the next step whose hash the replicas report (`StateHasher.every`), which the
        joiner checks against the swarm's records; None if none came within HASHED_WAIT_S. It waits through
        a pause of the swarm: a state at another step is one no record will vouch for, and the joiner
        refuses it (peer/checks/vouched_state.py), so serving it would only cost the joiner its download."""
        deadline = time.monotonic() + HASHED_WAIT_S
        while time.monotonic() < deadline and not self.catching_up():  # two left out at once: each asked the other
            got = await self.daemon.run(self._snapshot, follower, self.commit.hasher.every)
            if got is not None:
                return got
            await asyncio.sleep(0.05)  # poll the stage's step until it reaches a hashed one (bounded by the deadline)
        return None

    async def _on_request(self, body: bytes, sender: str) -> bytes:
        if (refusal := await self.daemon.admitted(sender, KIND_STATE)) is not None:
            return refusal
        try:
            req = decode_state_request(body, self.daemon.spec.run_hash)
        except WireError as e:
            return self.daemon.refuse(str(e), sender)
        now = time.monotonic()
        for sid in [s for s, (_, t) in self._snapshots.items() if now - t > SNAPSHOT_TTL_S]:
            del self._snapshots[sid]
        if req.op in ("meta", "now"):
            got = None if self.catching_up() else await (
                self._hashed_snapshot(sender) if self.hashed_only and req.op == "meta"
                else self.daemon.run(self._snapshot, sender))
            if got is None:
                return self.daemon.refuse(
                    "this replica is downloading its stage's state itself; ask another replica for it."
                    if self.catching_up() else f"this stage reached no step whose state the swarm records within "
                    f"{HASHED_WAIT_S:.0f} s (it is not training); ask again once it is.", sender)
            step, data = got
            sid = time.monotonic_ns()
            self._snapshots[sid] = (data, now)
            while len(self._snapshots) > MAX_SNAPSHOTS:
                del self._snapshots[min(self._snapshots)]
            self.served += 1
            log.info("stage %d: serving a snapshot at step %d (%.1f MB) to %s", self.daemon.stage, step + 1,
                     len(data) / 1e6, sender[-8:])
            return encode_state_meta(StateMeta(step, sid, len(data), STATE_CHUNK_BYTES, sha256_hex(data)))
        snap = self._snapshots.get(req.snapshot)
        if snap is None:
            return self.daemon.refuse("that snapshot is no longer served; ask for a new one.", sender)
        data = snap[0]
        start = req.index * STATE_CHUNK_BYTES
        if start >= len(data) and not (start == 0 and not data):
            return self.daemon.refuse("the chunk index is past the end of the snapshot.", sender)
        return data[start:start + STATE_CHUNK_BYTES]


async def download_state(link, donor: str, run: str, max_bytes: int, timeout: float = 120.0,
                         now: bool = False) -> tuple[int, dict]:
    """(step, state) of `donor`'s stage, downloaded in chunks and checked against its sha256. A joiner's
    (`now` False) is at a step the swarm's records vouch for where it has them; an exporter's (`now`) is the
    state as it is (the last step of a swarm that finished, which no record need hold)."""
    op = "now" if now else "meta"
    try:
        reply = await link.request(donor, KIND_STATE, encode_state_request(StateRequest(run, op)), timeout=timeout)
        if (reason := refusal_reason(reply)) is not None:
            raise StateError(f"{donor[-8:]} did not serve its state: {reason}")
        meta = decode_state_meta(reply, max_bytes)
        parts = []
        for i in range(max(1, -(-meta.total_bytes // meta.chunk_bytes))):
            req = encode_state_request(StateRequest(run, "chunk", i, meta.snapshot))
            parts.append(await link.request(donor, KIND_STATE, req, timeout=timeout))
    except WireError as e:
        raise StateError(f"the state offered by {donor[-8:]} is malformed ({e}).") from e
    except StateError:
        raise
    except Exception as e:  # transport failures of any kind
        raise StateError(f"could not download the state from {donor[-8:]} ({e}).") from e
    data = b"".join(parts)
    if len(data) != meta.total_bytes or sha256_hex(data) != meta.sha256:
        raise StateError(f"the state from {donor[-8:]} does not match its size or sha256.")
    try:
        state = load_state_bytes(data)
    except Exception as e:  # a snapshot that torch cannot load safely is refused, whatever the reason
        raise StateError(f"the state from {donor[-8:]} cannot be loaded safely ({type(e).__name__}).") from e
    return meta.step, state


class Follower:
    """A joiner's queue of reduced gradients forwarded by its donor, applied in step order (a powersgd
    step's sums rebuilt into its gradient by `rebuild`, `PowerSync.rebuilt`)."""

    def __init__(self, daemon: StageDaemon, on_applied: Callable[[int], None] | None = None,
                 rebuild: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        self.daemon, self.runner = daemon, daemon.runner
        self.rebuild = rebuild
        self.queue: dict[int, FollowUpdate] = {}
        self.on_applied = on_applied
        self.active = False
        self.donor: str | None = None  # the replica this one downloaded its state from: the only one it follows
        self._lock = asyncio.Lock()

    def on_update(self, update: FollowUpdate, sender: str) -> str | None:
        """Queue a reduced gradient from the donor; why it is refused otherwise."""
        if sender != self.donor:
            return "this replica follows only the replica it downloaded its state from."
        if update.step >= self.runner.step and len(self.queue) < MAX_QUEUED:
            self.queue[update.step] = update
        if self.active:
            self.daemon.spawn(self.catch_up())
        return None

    async def catch_up(self) -> int:
        """Apply every queued reduced gradient that is next in line; returns how many."""
        done = 0
        async with self._lock:
            while (update := self.queue.pop(self.runner.step, None)) is not None:
                try:
                    await self.daemon.run(self._apply, update)
                except StageError as e:
                    log.warning("stage %d: a forwarded gradient could not be applied (%s)", self.daemon.stage, e)
                    break
                self.daemon.stepped()
                done += 1
                if self.on_applied is not None:
                    self.on_applied(self.runner.step)
            for step in [s for s in self.queue if s < self.runner.step]:
                del self.queue[step]
        return done

    def _apply(self, update: FollowUpdate) -> None:
        grads = update.grads
        if update.factors is not None:
            if self.rebuild is None:
                raise StageError("a step forwarded in factors reached a stage that does not sum with powersgd.")
            grads = self.rebuild(*update.factors)
        self.runner.apply_flat(update.step, grads, update.stat, update.in_layout, update.skip)

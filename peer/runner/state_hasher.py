"""`StateHasher`: a replica's state hash after every `every`-th applied step, computed on a thread
while the next step's microbatches run.

The hash (`peer/runner/state_hash.py`) reads the stage's tensors by reference, so nothing may change them
until it is done: the next apply, a reduce (its reply comes after the last apply's hash is in), a
rollback and a stop wait for it (`wait`). A replica's apply reply carries its hash (the leader
tallies it, `peer/checks/state_votes.py`); the leader's own apply replies at once and its hash reaches
the tally through `on_hashed`, as does the replica's own-state check (swarm/replicas/own_state.py).
A hash that fails (no pinned memory to be had, say) is logged and that step goes unvouched.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .state_hash import HASH_EVERY, state_sha256

log = logging.getLogger(__name__)


class StateHasher:
    def __init__(self, stage: int, every: int = HASH_EVERY) -> None:
        self.stage = stage
        self.every = every  # 0: never
        self.last: tuple[int, str] | None = None  # (steps applied, sha256 hex) of the last state hashed here
        self.on_hashed: list[Callable[[tuple[int, str]], None]] = []
        self._task: asyncio.Task | None = None

    def due(self, steps: int) -> bool:
        """Whether the state after `steps` applied steps is hashed."""
        return self.every > 0 and steps % self.every == 0

    def start(self, steps: int, state: dict) -> None:
        """Hash `state` (the stage's after `steps` steps, tensors by reference) on a thread."""
        self._task = asyncio.create_task(self._hash(steps, state))

    async def wait(self) -> None:
        """Until the hash in progress, if any, is done (the state may change after it)."""
        if self._task is not None:
            await asyncio.gather(asyncio.shield(self._task), return_exceptions=True)

    async def _hash(self, steps: int, state: dict) -> None:
        try:
            sha = await asyncio.to_thread(state_sha256, state)
        except Exception:  # e.g. no pinned memory to be had: this step goes unvouched, the run goes on
            log.exception("stage %d: hashing the state after step %d failed; no hash is reported for it",
                          self.stage, steps)
            return
        self.last = (steps, sha)
        for hear in self.on_hashed:
            hear(self.last)

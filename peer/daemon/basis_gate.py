"""`BasisGate`: a stage's rules about basis versions (docs/algorithms.md 1.7, steps 5-6).

Which version a message of a given step must carry; whether a basis update may be taken
(signed by the swarm key, the next version, for a step not yet started); and, for the head,
waiting (bounded) for an update that is due before a step starts. The daemon asks; the
gate answers. It holds no network: it is handed a signature check and a way to pull updates.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from peer.runner.stage import StageError, StageRunner
from protocol.basis_update import BasisUpdate
from protocol.wire import Header

log = logging.getLogger(__name__)


class BasisGate:
    def __init__(self, runner: StageRunner, run: Callable[..., Awaitable], *,
                 verify_update: Callable[[BasisUpdate], bool] | None = None,
                 pull_updates: Callable[[], Awaitable[None]] | None = None, wait: float = 30.0) -> None:
        self.runner, self._run = runner, run  # `run` executes on the stage's worker thread, in order
        self.verify_update, self.pull_updates, self.wait = verify_update, pull_updates, wait
        # whether an update can still come (None: always): False while no coordinator holds the seat, so that a
        # head does not wait out `wait` at every switch step of a swarm that has none
        self.updates_come: Callable[[], Awaitable[bool]] | None = None

    def check(self, h: Header) -> tuple[str, str] | None:
        """(reason, code) to refuse a message whose basis version is not the one for its step."""
        want = self.runner.version_for_step(h.step)
        if h.basis_version == want:
            return None
        if h.basis_version > self.runner.basis_version and self.runner.scheduled is None:
            return f"basis version {h.basis_version} is not known here yet; retry shortly.", "retry"
        return (f"message for step {h.step} uses basis version {h.basis_version}, this stage uses version "
                f"{want} for that step.", "refused")

    async def accept(self, update: BasisUpdate) -> str | None:
        """Schedule a signed update if it is the next version for a step not yet started;
        otherwise say why it is refused (nothing changes)."""
        if self.verify_update is None or not self.verify_update(update):
            return f"basis update {update.version} is not signed by the swarm's coordinator key."
        try:
            await self._run(self.runner.schedule_basis, update.U, update.version, update.effective_step)
        except StageError as e:
            return str(e)
        log.info("stage %d: basis version %d scheduled for step %d", self.runner.stage, update.version,
                 update.effective_step)
        return None

    async def wait_for_switch(self, step: int) -> None:
        """Head: at a switch step, wait (bounded) for the coordinator's update before starting.
        If it does not come (coordinator away), training goes on with the current basis; with no coordinator in
        the seat (`updates_come`), at once."""
        runner, spec = self.runner, self.runner.spec
        if runner.basis is None or not spec.refits_basis:
            return
        refit = step - spec.basis_switch_delay
        if refit <= 0 or refit % spec.basis_interval or runner.basis_updated_step == step:
            return
        deadline = time.monotonic() + self.wait
        while runner.version_for_step(step) == runner.basis_version and runner.basis_updated_step != step:
            if time.monotonic() > deadline:
                log.warning("no basis update arrived for step %d; continuing on version %d", step + 1,
                            runner.basis_version)
                return
            if self.pull_updates is not None:
                await self.pull_updates()  # one signed before the coordinator left is taken here
            if (self.updates_come is not None and runner.version_for_step(step) == runner.basis_version
                    and runner.basis_updated_step != step and not await self.updates_come()):
                log.info("no coordinator holds the seat, so no basis update comes for step %d; continuing on "
                         "version %d", step + 1, runner.basis_version)
                return
            await asyncio.sleep(0.1)  # poll interval while the coordinator's update propagates

"""`StagePeer`: one replica of one stage, whole: its daemon (the microbatches), its commit
(reduce and apply with the other replicas), its state service (joiners download from it),
its follower (when it joins late itself), its snapshots (taken every `every` steps, kept for
other stages, restored from when a stage lost every replica) and rollback, and, on a head,
the step driver.

It is written against the two interfaces of `peer/daemon/interfaces.py` only, so the same peer runs
over the in-memory loopback in tests and over libp2p in `swarm/node.py`.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import torch

from peer.checks.vouched_state import VouchedStates
from peer.commit.commit import StepCommit
from peer.daemon.daemon import StageDaemon
from peer.daemon.interfaces import MessageLink, PeerDirectory, PeerStatus
from peer.runner.stage import StageError, StageRunner
from peer.runner.state_hash import state_sha256
from peer.state.rollback import Rollback
from peer.state.snapshots import SnapshotService
from peer.state.state_transfer import Follower, StateError, StateService, download_state
from peer.step.driver import StepDriver, StepLog
from protocol.spec import RunSpec

log = logging.getLogger(__name__)


class StagePeer:
    def __init__(self, runner: StageRunner, link: MessageLink, directory: PeerDirectory, *,
                 batches: Callable[[int, int], torch.Tensor] | None = None,
                 verify_state: Callable[[dict], Awaitable[str | None]] | None = None,
                 daemon_options: dict | None = None, commit_options: dict | None = None,
                 driver_options: dict | None = None, snapshot_options: dict | None = None) -> None:
        self.runner, self.link, self.directory = runner, link, directory
        self.spec: RunSpec = runner.spec
        self.daemon = StageDaemon(runner, link, directory, **(daemon_options or {}))
        self.commit = StepCommit(self.daemon, **(commit_options or {}))
        self.state = StateService(self.daemon, self.commit)
        self.follower = Follower(self.daemon, rebuild=self.commit.power.rebuilt if self.commit.power else None)
        self.verify_state = verify_state  # extra checks of a downloaded state (e.g. its basis is the signed one)
        self.vouched: VouchedStates | None = None  # a download's check against the swarm's state hashes
        self.driver = StepDriver(self.daemon, self.commit, directory, batches, **(driver_options or {})) \
            if runner.is_first and batches is not None else None
        self.snapshots = SnapshotService(self.daemon, **(snapshot_options or {}))
        self.rollback = Rollback(self.daemon, self.commit, self.snapshots, self.follower, self._check_state)
        self.on_applied: Callable[[int], None] | None = None  # the owner's hook, called with the new step number
        self.commit.on_applied = self.follower.on_applied = self._applied
        self.commit.on_rollback = self.rollback.on_command
        self.commit.own_snapshot = self.snapshots.newest_own  # its hash reaches the leader in reduce replies
        if self.driver is not None and self.snapshots.every > 0:  # no snapshots: nothing to roll back to
            self.driver.realign = lambda: self.rollback.realign(self.driver)

    @property
    def peer_id(self) -> str:
        return self.daemon.peer_id

    async def start(self) -> None:
        """Serve every handler of this stage (the peer is announced by its owner)."""
        await self.daemon.start()
        await self.commit.start()
        await self.state.start()
        await self.commit.forwarder.serve(self.follower.on_update)
        await self.snapshots.start()

    def _applied(self, step: int) -> None:
        self.snapshots.after_step(step)
        if self.on_applied is not None:
            self.on_applied(step)

    def status(self, state: str | None = None) -> PeerStatus:
        return self.daemon.status(state)

    async def announce(self, state: str | None = None) -> None:
        await self.directory.announce(self.status(state))

    async def join(self, donors: list[str], timeout: float = 120.0, announced: dict[str, int] | None = None) -> str:
        """Download the stage's state from the first donor that gives a good one, then apply
        the reduced gradients it forwards until this replica is level; returns the donor.
        `announced`: donor -> the step it announces (checked against the vouched states)."""
        problems = []
        for donor in donors:
            self.follower.donor = donor
            try:
                why = await self.vouched.donor_problem((announced or {}).get(donor, 0)) if self.vouched else None
                if why:
                    raise StateError(f"{donor[-8:]} is not asked for the state: {why}")
                step, state = await download_state(self.link, donor, self.spec.run_hash, _max_state_bytes(self.runner),
                                                   timeout)
                # the hash of what was loaded (peer/runner/state_hash.py), not the donor's word on its bytes
                problem = await self.vouched.check(step, await asyncio.to_thread(state_sha256, state)) \
                    if self.vouched is not None else None
                problem = problem or await self._check_state(state, step)
                if problem:
                    raise StateError(f"the state from {donor[-8:]} is refused: {problem}")
                await self.daemon.run(self.runner.load_state_dict, state)
            except (StateError, StageError) as e:
                problems.append(str(e))
                log.warning("%s", e)
                continue
            self.daemon.stepped()
            self.follower.active = True
            applied = await self.follower.catch_up()
            log.info("stage %d: joined from %s at step %d (+%d forwarded steps)", self.runner.stage, donor[-8:],
                     step + 1, applied)
            return donor
        raise StateError("no replica gave a usable state: " + ("; ".join(problems) or "none was reachable."))

    async def restore(self, step: int | None = None, swarm_step: int | None = None) -> int:
        """Load this stage's newest snapshot that a live peer holds (or the one at `step`), for a
        stage with no live replica; returns its step. Raises `NoSnapshot` if none is held (step 0's, the
        initial state, counts as held while the swarm, at `swarm_step`, is younger than its first snapshot)."""
        return await self.snapshots.restore(self._check_state, step, swarm_step)

    async def _check_state(self, state: dict, step: int) -> str | None:
        if state.get("spec") != self.spec.to_json() or state.get("stage") != self.runner.stage:
            return "it belongs to another run or stage."
        if int(state.get("step", -1)) != step:
            return "its step does not match its description."
        for name, t in state.get("module", {}).items():
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"{name} holds NaN or infinite values."
        return await self.verify_state(state) if self.verify_state is not None else None

    async def drive(self, until: int | None, on_step: Callable[[StepLog], None]) -> None:
        if self.driver is None:
            raise RuntimeError("only a head with a data source drives steps.")
        await self.driver.drive(until, on_step)

    async def stop(self) -> None:
        await self.commit.hasher.wait()  # a state hash on its thread ends first (it reads the runner's tensors)
        await self.daemon.stop()


def _max_state_bytes(runner: StageRunner) -> int:
    """A generous bound on a stage's serialised state: weights, two moments, basis, slack."""
    elem = torch.tensor([], dtype=runner.dtype).element_size()
    return 4 * runner.n_params * max(elem, 4) + (64 << 20)

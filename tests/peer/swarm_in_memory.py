"""The peer tests' in-memory swarm lives in `peer/replica/memory_swarm.py` (the replica-sync benchmark uses it too);
`patient_options` is the tests' own."""
import asyncio

from peer.daemon.loopback import LoopbackDirectory
from peer.replica.memory_swarm import (
    TEST_COMMIT_OPTIONS,
    TEST_DRIVER_OPTIONS,
    MemorySwarm,
    batches,
    make_swarm,
    oracle,
    param_hash,
)
from peer.step.driver import StepLog

__all__ = ["MemorySwarm", "batches", "make_swarm", "oracle", "param_hash", "patient_options", "routers_skip",
           "run_and_stop"]


def routers_skip(monkeypatch, names: set[str]) -> None:
    """Every in-memory router picks around `names`: replicas that never get a microbatch (idle members)."""
    pick = LoopbackDirectory.pick

    async def skipping(self, stage: int, exclude=frozenset()) -> str:
        return await pick(self, stage, set(exclude) | names)
    monkeypatch.setattr(LoopbackDirectory, "pick", skipping)


def patient_options() -> dict:
    """MemorySwarm options for tests that prove no attempt fails (one attempt a step, exact traffic):
    a loaded 2-core CI machine can stall a step for seconds, and the deadlines are not what those
    tests prove, so a missed one must not re-drive a step there. Failures then cost minutes, not seconds."""
    return dict(driver_options=dict(TEST_DRIVER_OPTIONS, min_timeout=120.0, first_timeout=120.0, ping_period=1.0),
                commit_options=dict(TEST_COMMIT_OPTIONS, reduce_timeout=120.0),
                daemon_options=dict(deadline_floor=120.0))  # nor may a microbatch's deadline re-send one


async def run_and_stop(swarm: MemorySwarm, steps: int, deadline: float = 600.0) -> list[StepLog]:
    """The logs of `steps` steps driven (a drive that never commits fails after `deadline` s, never hangs), once every
    apply is sent; every peer stopped, whatever happened."""
    try:
        logs = await asyncio.wait_for(swarm.drive(steps), deadline)
        await swarm.applied()
    finally:
        await swarm.stop()
    return logs

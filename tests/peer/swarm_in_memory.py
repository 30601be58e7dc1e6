"""The peer tests' in-memory swarm lives in `peer/replica/memory_swarm.py` (the replica-sync benchmark uses it too);
`patient_options` is the tests' own."""
from peer.replica.memory_swarm import (
    TEST_COMMIT_OPTIONS,
    TEST_DRIVER_OPTIONS,
    MemorySwarm,
    batches,
    make_swarm,
    oracle,
    param_hash,
)

__all__ = ["MemorySwarm", "batches", "make_swarm", "oracle", "param_hash", "patient_options"]


def patient_options() -> dict:
    """MemorySwarm options for tests that prove no attempt fails (one attempt a step, exact traffic):
    a loaded 2-core CI machine can stall a step for seconds, and the deadlines are not what those
    tests prove, so a missed one must not re-drive a step there. Failures then cost minutes, not seconds."""
    return dict(driver_options=dict(TEST_DRIVER_OPTIONS, min_timeout=120.0, first_timeout=120.0, ping_period=1.0),
                commit_options=dict(TEST_COMMIT_OPTIONS, reduce_timeout=120.0),
                daemon_options=dict(deadline_floor=120.0))  # nor may a microbatch's deadline re-send one

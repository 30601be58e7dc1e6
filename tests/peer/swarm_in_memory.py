"""The peer tests' in-memory swarm lives in `peer/replica/memory_swarm.py` (the replica-sync benchmark uses it too)."""
from peer.replica.memory_swarm import MemorySwarm, batches, make_swarm, oracle, param_hash, patient_options

__all__ = ["MemorySwarm", "batches", "make_swarm", "oracle", "param_hash", "patient_options"]

"""One replica of one stage, whole, and a swarm of them in one process.

- `stage_peer.py`: `StagePeer` (daemon, commit, state service, follower, and a head's driver).
- `memory_swarm.py`: `MemorySwarm`, `StagePeer`s over the loopback network (peer tests, benches).
"""
from .memory_swarm import MemorySwarm, make_swarm
from .stage_peer import StagePeer

__all__ = ["MemorySwarm", "StagePeer", "make_swarm"]

"""The swarm's DHT: every key and record, the store that reads and writes them, and the
life cycle of a DHT node.

- `records.py`: every DHT key and record schema (`SignedRunSpec`, `StageAnnouncement`,
  key functions, `RecordError`); nowhere else may a key be spelled.
- `store.py`: `SwarmDHT`, the async reads and writes of those records over `hivemind.DHT`.
- `process.py`: starting and stopping a DHT node (a child process with its own p2pd), and
  making sure nothing of it outlives its owner.
"""
from .process import close_node, start_dht, stop_dht
from .records import (
                      RUN_KEY,
                      RUN_SPEC_DOMAIN,
                      STATES,
                      RecordError,
                      SignedRunSpec,
                      StageAnnouncement,
                      basis_key,
                      health_key,
                      run_hash_of,
                      stage_key,
)
from .store import SwarmDHT

__all__ = [
    "RUN_KEY", "RUN_SPEC_DOMAIN", "STATES", "RecordError", "SignedRunSpec", "StageAnnouncement", "SwarmDHT",
    "basis_key", "close_node", "health_key", "run_hash_of", "stage_key", "start_dht", "stop_dht",
]

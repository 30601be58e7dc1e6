"""The swarm's DHT: every key and record, the store that reads and writes them, and the
life cycle of a DHT node.

- `records.py`: every DHT key and record schema (`SignedRunSpec`, `StageAnnouncement`,
  key functions, `RecordError`); nowhere else may a key be spelled.
- `store.py`: `SwarmDHT`, the async reads and writes of those records over `hivemind.DHT`.
- `envelope.py`: the signed envelope every record travels in, and the one check of who may
  write it (`check_envelope`).
- `validator.py`: that check inside every DHT node (`SwarmRecordValidator`), and `set_policy`.
- `swarm_records.py`: the records the swarm key signs (leases, vouched hashes, pardons, coordinator
  claims), and the fence that keeps a coordinator without the seat from signing them (`SeatLost`).
- `seat_reader.py`: which coordinator holds the seat (`seat_holder`, `ActiveCoordinator`).
- `held.py`, `record_share.py`, `record_service.py`: the coordinator's run spec, lease and basis updates as
  each node holds them, re-served to peers that find none in the DHT (every coordinator down), and checked.
- `spec_fetch.py`: the run spec a reader trusts, from the DHT or else from the peers (`read_spec`, `fetch_spec`).
- `network_cap.py`: at most a few announced ids per stage per /24 or /48, and per /16 or /32
  block, counted where this node's connections see them (applied by `SwarmDHT.stage_peers`).
- `process.py`: starting and stopping a DHT node (a child process with its own p2pd), and
  making sure nothing of it outlives its owner.
"""
from .envelope import CLOCK_SKEW_S, Envelope, check_envelope
from .process import close_node, start_dht, stop_dht
from .records import (
                      KEY_KINDS,
                      RUN_KEY,
                      RUN_SPEC_DOMAIN,
                      STATES,
                      CoordinatorClaim,
                      LeaderLease,
                      Pardons,
                      RecordError,
                      SignedRunSpec,
                      StageAnnouncement,
                      VouchedSnapshots,
                      basis_key,
                      basis_subkey,
                      coordinator_key,
                      health_key,
                      kind_of,
                      lease_key,
                      pardons_key,
                      run_hash_of,
                      snapshots_key,
                      stage_key,
                      states_key,
)
from .seat_reader import ActiveCoordinator, seat_holder
from .store import SwarmDHT
from .validator import SwarmRecordValidator, refused_records, set_policy

__all__ = [
    "CLOCK_SKEW_S", "KEY_KINDS", "RUN_KEY", "RUN_SPEC_DOMAIN", "STATES", "ActiveCoordinator", "CoordinatorClaim",
    "Envelope", "coordinator_key", "seat_holder", "LeaderLease", "Pardons",
    "RecordError", "SignedRunSpec", "StageAnnouncement", "SwarmDHT", "SwarmRecordValidator", "basis_key",
    "basis_subkey", "check_envelope", "close_node", "health_key", "kind_of", "lease_key", "pardons_key",
    "refused_records", "run_hash_of", "set_policy", "snapshots_key", "stage_key", "states_key", "start_dht",
    "stop_dht", "VouchedSnapshots",
]

"""The coordinator: the swarm's bootstrap node and the holder of its signing key.

- `options.py`: `CoordinatorOptions` (every flag of `swarm coordinator`) and `sealed_spec`, the run spec
  as the swarm sees it.
- `run.py`: `run_coordinator`, one coordinator process from its DHT node to its duties.
- `seat.py`: `CoordinatorSeat`, which of several coordinators with one key is the active one (`--standby`).
- `duties.py`: `CoordinatorDuties`, what the active one does (leases, vouched hashes, re-fits, revocations),
  resumed from the DHT when it takes the seat.
"""
from .options import DEFAULT_WORK_BITS, CoordinatorOptions, sealed_spec
from .run import run_coordinator

__all__ = ["DEFAULT_WORK_BITS", "CoordinatorOptions", "run_coordinator", "sealed_spec"]

"""A stage's state moving between peers: downloads, snapshots and rollback.

- `state_transfer.py`: a joining replica downloads the stage's state from a live one (`StateService`,
  `Follower`, `StateError`).
- `snapshot_store.py`, `snapshots.py`: snapshots a peer keeps for other stages (custody), and a stage
  restored from one.
- `rollback.py`: `Rollback`, every stage back to a restored stage's step or a lease's rollback order.
"""
from .rollback import Rollback
from .snapshot_store import SnapshotStore
from .snapshots import SnapshotService
from .state_transfer import Follower, StateError, StateService

__all__ = ["Follower", "Rollback", "SnapshotService", "SnapshotStore", "StateError", "StateService"]

"""Grassmann basis updates over the network (the math is `protocol/basis_update.py`).

- `refit.py`: `BasisRefitter`, the coordinator's side: gathers the stages' statistics,
  takes the capped step, signs, stores and pushes the new basis.
- `sync.py`: `BasisSync`, a peer's side: verifies updates, sends its statistic, pulls
  updates it missed, and catches up a peer that joins late or restarts.
"""
from .refit import BasisRefitter
from .sync import BasisSync

__all__ = ["BasisRefitter", "BasisSync"]

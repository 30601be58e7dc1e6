"""One step of the whole swarm: the leading head drives it, every stage's replicas commit it together.

- `driver.py`: `StepDriver`, the leading head's loop (standby heads, take-over); `leadership.py`:
  `leader_of`; `calibration.py`: a standby head's measured speed; `head_work.py`: every head's share
  of the microbatches; `commands.py`: the leader's commands; `attempt_watch.py`: a dead peer ends
  an attempt in seconds.
- `commit.py`: `StepCommit`, reduce, apply, check; `reduce_exchange.py`, `reduce_watch.py`: a reduce's
  messages and its wait; `follow_forward.py`: reduced sums forwarded to replicas catching up.
"""
from .commit import StepCommit
from .driver import StepDriver
from .leadership import leader_of

__all__ = ["StepCommit", "StepDriver", "leader_of"]

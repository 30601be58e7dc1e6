"""One step of the whole swarm: the leading head drives it, every stage's replicas commit it together.

- `driver.py`: `StepDriver`, the leading head's loop (take-over, one step after another);
  `succession.py`: which head leads as a head sees it, and a standby head's pings; `leadership.py`:
  `leader_of`; `calibration.py`: a standby head's measured speed; `microbatch_phase.py`: an attempt's
  microbatches out and back within a deadline; `head_work.py`: every head's share of the microbatches;
  `reduce_verdict.py`: the leader's reading of a reduce's replies; `commands.py`: the leader's commands;
  `attempt_watch.py`: a dead peer ends an attempt in seconds.
- `commit.py`: `StepCommit`, reduce, apply, check; `reduce_exchange.py`, `reduce_watch.py`: a reduce's
  messages and its wait; `follow_forward.py`: reduced sums forwarded to replicas catching up.
"""
from .commit import StepCommit
from .driver import StepDriver
from .leadership import leader_of

__all__ = ["StepCommit", "StepDriver", "leader_of"]

"""One step of the whole swarm as the heads drive it: the leading head's loop, its commands and its reading of
the replies (every stage's replicas commit the step together: peer/commit/).

- `driver.py`: `StepDriver`, the leading head's loop (take-over, one step after another);
  `succession.py`: which head leads as a head sees it, and a standby head's pings; `leadership.py`:
  `leader_of`; `calibration.py`: a standby head's measured speed; `microbatch_phase.py`: an attempt's
  microbatches out and back within a deadline; `seats.py`: which members sit in a step's reduce (work first);
  `reduce_verdict.py`: the leader's reading of a reduce's replies;
  `commands.py`: the leader's commands; `redrive_cause.py`: why an attempt failed, and whom it names;
  `attempt_watch.py`: a dead peer ends an attempt in seconds.
"""
from .driver import StepDriver
from .leadership import leader_of

__all__ = ["StepDriver", "leader_of"]

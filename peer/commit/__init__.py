"""A step's end at every replica: the work a head is given, then the reduce with the stage's other replicas, the
apply and the checks (the leading head that asks for them: peer/step/).

- `commit.py`: `StepCommit`, reduce, apply, check; `reduce_exchange.py`, `reduce_watch.py`: a reduce's messages
  and its wait; `follow_forward.py`: reduced sums forwarded to replicas catching up; `head_work.py`: every head's
  share of the microbatches (the leader's split, a head's serving of it).
"""
from .commit import StepCommit

__all__ = ["StepCommit"]

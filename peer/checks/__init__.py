"""Verification: how replicas find out that one of them lied, and what the swarm agrees its state is.

- `share_check.py`: `ShareCheck`, a replica recomputes another's share from its inputs.
- `spot_checks.py`: `SpotChecks`, the leader's verdicts (draws, two of three, disputes, bans).
- `boundary_evidence.py`: `BoundaryEvidence`, which end of a boundary message lies, by its sender's signature.
- `robust_sum.py`: `suspects`, a share far from the rest.
- `state_votes.py`: `StateVotes`, the leader's tally of the replicas' state hashes.
- `vouched_state.py`: `VouchedStates`, a joiner's check of a donor's state against the vouched hash.
"""
from .share_check import ShareCheck
from .spot_checks import SpotChecks
from .state_votes import StateVotes
from .vouched_state import VouchedStates

__all__ = ["ShareCheck", "SpotChecks", "StateVotes", "VouchedStates"]

"""Which head leads: one rule that every peer computes from the heads' announcements, so that the
heads (`peer/driver.py`) and every stage's admission (`swarm/replicas/membership.py`) agree.

    claimants = live heads that announce `leads`
    leader    = min(claimants by peer id)                 if any claimant
              = min(heads at the highest announced step)  otherwise

A leader stays the leader: a head that joins later, whatever its id, sees the claim and stands
by, so a newcomer (or a stranger's cheap low id) does not take the lead from a head that drives.
Claims collide only when heads start at the same moment (each saw none); the lowest id among the
claimants keeps leading and the others stand down at their next look. With no claimant (the
leader died or left), a head at the swarm's step takes over: one that is behind never leads.
"""
from __future__ import annotations

from collections.abc import Iterable

from .interfaces import PeerInfo


def leader_of(heads: Iterable[PeerInfo]) -> str | None:
    """The peer id every peer follows among `heads` (the live heads a peer sees), or None."""
    heads = list(heads)
    if not heads:
        return None
    claimants = [h.peer_id for h in heads if h.leads]
    if claimants:
        return min(claimants)
    top = max(h.step for h in heads)
    return min(h.peer_id for h in heads if h.step == top)

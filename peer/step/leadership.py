"""Which head leads: one rule that every peer computes from the heads' announcements and the
swarm key's lease, so that the heads (`peer/step/driver.py`) and every stage's admission
(`swarm/replicas/membership.py`) agree.

With a lease (every swarm with a coordinator; `swarm/trust/leases.py` grants it):

    leader = the first head of lease.order that is live        (None: no live head holds a lease)

A head that the lease does not name never leads, whatever its id, step or claim: roles come
from the swarm key. The heads after the leader are its successors in order, so when the
leader dies the next live one leads at once, with or without the coordinator. "Live" is what
this peer sees: announced online or paused, and not set aside after failing to answer.

Without a lease (in-memory swarms of the tests, which have no coordinator), the older rule:

    claimants = live heads that announce `leads`
    leader    = min(claimants by peer id)                 if any claimant
              = min(heads at the highest announced step)  otherwise

A leader stays the leader there: a head that joins later, whatever its id, sees the claim and
stands by; with no claimant, a head at the swarm's step takes over.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from peer.daemon.interfaces import PeerInfo


def leader_of(heads: Iterable[PeerInfo], order: Sequence[str] | None = None) -> str | None:
    """The peer id every peer follows among `heads` (the live heads a peer sees), or None.
    `order`: the lease's order of heads (None: the swarm has no lease)."""
    heads = list(heads)
    if order is not None:
        live = {h.peer_id for h in heads}
        return next((p for p in order if p in live), None)
    if not heads:
        return None
    claimants = [h.peer_id for h in heads if h.leads]
    if claimants:
        return min(claimants)
    top = max(h.step for h in heads)
    return min(h.peer_id for h in heads if h.step == top)

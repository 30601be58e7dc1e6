"""Replicas: several peers serving one stage with identical state, and how traffic and roles
are shared among them.

- `router.py`: `Router`, the `PeerDirectory` over the DHT: which replica of a stage gets the
  next microbatch (least queued x measured round trip), and bans of peers that failed.
- `membership.py`: `Membership`, who may send which message to this stage (the leading head,
  the previous and next stages, this stage's replicas).
- `placement.py`: which stage a peer takes when it joins (`choose_stage`) and whether it
  should move later (`move_target`; `Rebalancer` holds a peer that just joined or moved).
- `replica.py`: `ReplicaService`, this process serving one stage as one of its replicas:
  state download, announcements, checkpoints, driving steps when it is a head.

Import from the module itself (`from swarm.replicas.router import Router`): `replica.py`
needs the whole network stack, and this map stays free of imports so that the lower rooms
(`swarm.monitor`, `swarm.export`) can take the router without it.
"""

"""Replicas: several peers serving one stage with identical state, and how traffic and roles
are shared among them.

- `router.py`: `Router`, the `PeerDirectory` over the DHT: which replica of a stage gets the
  next microbatch (least queued x measured round trip), and bans of peers that failed.
- `run_bans.py`: `RunBans`, the peers banned for the run, and the swarm key's pardons (`swarm unban`).
- `membership.py`: `Membership`, who may send which message to this stage (the leading head,
  the previous and next stages, this stage's replicas).
- `placement.py`: which stage a peer takes when it joins (`choose_stage`) and whether it
  should move later (`move_target`; `Rebalancer` holds a peer that just joined or moved).
- `replica.py`: `ReplicaService`, this process serving one stage as one of its replicas:
  state download, announcements, checkpoints, driving steps when it is a head.
- `work_records.py`: `WorkRecords`, what a leading head tells the coordinator (re-fit workers,
  snapshot and state hashes, a rollback it is about to order).

Import from the module itself (`from swarm.replicas.router import Router`): `replica.py`
needs the whole network stack, and this map stays free of imports so that the lower rooms
(`swarm.monitor`, `swarm.export`) can take the router without it.
"""

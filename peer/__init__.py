"""One volunteer's process, minus the network: hosts one pipeline stage, trains it, and serves its neighbours.

Rooms, lowest first (a room imports only rooms above it in this list, and `protocol`):

- `runner/`: a stage's training state (`StageRunner`), its hash, checkpoints, the in-process pipeline.
- `data/`: the corpus, the tokenizer and deterministic microbatches.
- `daemon/`: the asyncio service around a runner (`StageDaemon`) and the seam to the network.
- `checks/`: verification: share recomputation, spot checks, state votes, vouched states.
- `commit/`: a step's end at every replica (`StepCommit`): a head's share of the work, reduce, apply.
- `step/`: one step of the swarm as the heads drive it: the leading head's `StepDriver`.
- `state/`: state downloads, snapshots and rollback.
- `replica/`: one replica whole (`StagePeer`) and an in-memory swarm of them.
"""

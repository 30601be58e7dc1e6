"""What replicas of a stage cost and buy (no module imported here: the benches are imported when they run):

- `bench.py`: `swarm bench replicas`: tokens/s with 1, 2, 3 replicas per stage; seconds from a replica's death to
  the next step.
- `replica_sync.py`: `swarm bench replica-sync`: per replica-sync mode, bytes per replica per step, tokens/s with
  2 replicas per stage on shaped links, held-out loss at equal tokens.
- `sync_bytes.py`: the bytes one replica sends per step per mode (exact figures; the simulator uses them too).
- `verify.py`: `swarm bench verify`: what spot checks cost: tokens/s and input bytes per step at rates 0, 1/16, 1.
- `share_tolerance.py`: `swarm bench share-tolerance`: how far honest computations of a replica's share fall
  apart against what lies score: the measurement behind spot checks' tolerance.
- `cli.py`: the subcommands and what runs them.
"""

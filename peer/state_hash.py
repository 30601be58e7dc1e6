"""A stage's state as bytes, and the sha256 that names it: what a donor serves a joiner, what a
snapshot holds, and what every replica reports after each applied step (the leader votes on it
per stage, `peer/state_votes.py`, and the swarm key vouches for the agreed one).

    state hash = sha256( torch.save(StageRunner.state_dict()) )

torch.save of the same tensors and values writes the same bytes (no timestamps, no addresses),
so replicas whose weights, optimizer moments, step, basis and statistic are equal bit for bit
report one hash, and a joiner that downloads a state recomputes it from the bytes it got.

Cost (measured on the 2-core dev machine, CPU, one thread, before the first optimizer step; the
moments triple the state after it): `tiny` stage 2.1 MB, 6 ms; `small` stage 51 MB, 82-102 ms.
That is below 1% of a step of either preset on this machine (docs/security.md, "Vouched state"),
so every step is hashed; `StepCommit.hash_every` hashes every k-th step instead.
"""
from __future__ import annotations

import hashlib
import io

import torch


def state_bytes(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def state_sha256(state: dict) -> str:
    """The state hash (the formula above), hex."""
    return hashlib.sha256(state_bytes(state)).hexdigest()

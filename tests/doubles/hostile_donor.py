"""A test double: a replica that trains honestly but serves joiners a state with noisy weights,
under the sha256 of what it serves, and boasts a huge throughput and a step ahead of its own
("far": 1000 steps, which the swarm's records do not know; "near": 2, which they may), so that
a joiner tries it first (joiners try donors by announced step, then throughput). It re-announces
after every step, not only every heartbeat, so that its boast stays ahead of the honest
replicas' announcements however fast the swarm steps. What issue 21's attacker did to the state
transfer; the joiner's check against the vouched state hashes must refuse it
(`peer/checks/vouched_state.py`). In memory: `serve_bad_state(peer, how)`; as a process:
`tests/doubles/hostile_peer.py`."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import torch

from peer.replica.stage_peer import StagePeer
from peer.state.state_transfer import load_state_bytes, state_bytes

log = logging.getLogger(__name__)

AHEAD = {"far": 1000, "near": 2}  # steps a liar adds to the step it announces


def serve_bad_state(peer: StagePeer, how: str) -> None:
    """Make `peer` the hostile donor that `how` ("far" or "near") says, from its next message on."""
    honest_snapshot, honest_status = peer.state._snapshot, peer.daemon.status

    def snapshot(follower: str, every: int = 1) -> tuple[int, bytes] | None:
        got = honest_snapshot(follower, every)
        if got is None:
            return None
        step, data = got
        state = load_state_bytes(data)
        gen = torch.Generator().manual_seed(step)
        for t in state["module"].values():
            if t.is_floating_point():
                t.add_(0.1 * torch.randn(t.shape, generator=gen, dtype=t.dtype))
        log.warning("serving a state with noisy weights at step %d (a test double: tests/doubles)", step + 1)
        return step, state_bytes(state)

    def status(state: str | None = None):
        s = honest_status(state)
        return replace(s, throughput=1e9, step=s.step + AHEAD[how])

    honest_applied = peer.commit.on_applied
    announcing: list[asyncio.Task] = []

    def applied(step: int) -> None:
        honest_applied(step)
        if not announcing or announcing[-1].done():  # one store at a time: a slow DHT skips steps, never piles up
            announcing[:] = [asyncio.get_running_loop().create_task(peer.announce())]

    peer.state._snapshot = snapshot
    peer.daemon.status = status
    peer.commit.on_applied = peer.follower.on_applied = applied

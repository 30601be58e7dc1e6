"""Which stage a peer serves: the choice at join time and the periodic re-check.

Joining with `--stage auto` (as Petals' `choose_best_blocks` / `should_choose_other_blocks`
do for blocks): take the stage with the fewest peers, then the lowest total throughput (ties:
the earliest stage), announce "joining" there, wait a random moment, and look again: peers
that started at the same time saw the same empty directory and may have piled onto one
stage. If a stage is still empty while ours has two or more peers, the joining peer with the
highest id among ours moves to it (one mover per stage per round, deterministic, so two never
swap past each other); a few rounds settle any simultaneous start.

While serving, every `rebalance_period` a peer asks `move_target`: it moves (with a state
download) only when its stage keeps at least one other live peer and either a stage is empty
or moving raises the swarm's weakest stage throughput clearly (by `gain`, 1.25x). Only the
highest id of a stage moves in one period, so a stage is never emptied by its own peers.
"""
from __future__ import annotations

import asyncio
import logging
import random

from peer.interfaces import PeerStatus
from protocol.spec import RunSpec
from swarm.dht import StageAnnouncement
from swarm.replicas.router import LIVE_STATES, Router

log = logging.getLogger(__name__)

PRESENT = (*LIVE_STATES, "joining", "syncing")  # announced states that count as a stage's peers


class PlacementError(ValueError):
    """A stage that cannot be chosen; the text says what to pass instead."""


async def directory(router: Router, n_stages: int, states=PRESENT) -> dict[int, list[StageAnnouncement]]:
    found = await asyncio.gather(*(router.announced(s, fresh=True) for s in range(n_stages)))
    return {s: [a for a in anns if a.state in states] for s, anns in enumerate(found)}


def _load(anns: list[StageAnnouncement]) -> tuple[int, float]:
    return len(anns), sum(a.throughput for a in anns)


async def choose_stage(router: Router, spec: RunSpec, requested: str, rng: random.Random | None = None,
                       jitter: tuple[float, float] = (0.3, 1.2), rounds: int = 6) -> int:
    """The stage to serve: `requested` if it is a number, else the least covered (see above)."""
    if requested != "auto":
        try:
            stage = int(requested)
        except ValueError:
            raise PlacementError(f"--stage must be a stage number or auto, not {requested!r}.") from None
        if not 0 <= stage < spec.n_stages:
            raise PlacementError(f"--stage {stage} does not exist: this run has stages 0..{spec.n_stages - 1}.")
        return stage
    rng = rng or random.Random()
    peers = await directory(router, spec.n_stages)
    loads = {s: _load([a for a in anns if a.peer_id != router.peer_id]) for s, anns in peers.items()}
    best = min(loads.values())
    stage = min(s for s, load in loads.items() if load == best)  # ties: the earliest stage (a lone first peer heads)
    for _ in range(rounds):
        await router.announce(PeerStatus(stage, "joining"))
        await asyncio.sleep(rng.uniform(*jitter))  # deliberate jitter: simultaneous joiners look at different moments
        peers = await directory(router, spec.n_stages)
        peers[stage] = [a for a in peers[stage] if a.peer_id != router.peer_id] + [_me(router, stage)]
        empty = sorted(s for s, anns in peers.items() if not anns)
        joining_here = sorted(a.peer_id for a in peers[stage] if a.state == "joining")
        if not empty or len(peers[stage]) < 2 or joining_here[-1] != router.peer_id:
            break
        log.info("stage %d is empty and stage %d has %d peers: this peer moves to stage %d", empty[0], stage,
                 len(peers[stage]), empty[0])
        stage = empty[0]
    return stage


def _me(router: Router, stage: int) -> StageAnnouncement:
    return router.announcement(PeerStatus(stage, "joining"))


async def move_target(router: Router, spec: RunSpec, stage: int, throughput: float, gain: float = 1.25) -> int | None:
    """The stage this peer should move to now, or None (see the module docstring)."""
    peers = await directory(router, spec.n_stages, LIVE_STATES + ("syncing",))
    mine = peers[stage]
    if len(mine) < 2 or max(a.peer_id for a in mine) != router.peer_id:
        return None
    empty = [s for s, anns in peers.items() if not anns]
    if empty:
        return empty[0]
    tput = {s: _load(anns)[1] for s, anns in peers.items()}
    if min(tput.values()) <= 0:  # a stage with no measured speed (a stalled or starting swarm) is no evidence
        return None
    weakest = min(tput, key=tput.get)
    if weakest == stage or throughput <= 0:
        return None
    after = dict(tput)
    after[stage] -= throughput
    after[weakest] += throughput
    return weakest if min(after.values()) > gain * min(tput.values()) else None

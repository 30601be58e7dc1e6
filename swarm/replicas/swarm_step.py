"""The step the swarm is on, as a peer that finds no live replica of its stage judges it: from the
other peers' announced steps, of which only those the swarm key's records support count.

An announcement is a claim its peer signs about itself (issue 20: a claim counts only when someone
who can check it has). Where the swarm has a swarm key (a coordinator signed the run spec), a peer's
announced step counts only if

- it is at most `SLACK` steps past the newest step the swarm key vouches for (a state hash or a
  snapshot, of any stage: `swarm/replicas/vouched.py`). States are hashed every `HASH_EVERY` steps
  and a hash reaches the record a step or two later, so a live honest swarm is at most
  `2 * HASH_EVERY + 2` steps past it, the slack a joiner's download is checked with too
  (`peer/checks/vouched_state.py`). With no vouched record at all the bound is 0: a swarm that has not
  trained yet is not made to wait by a claim of a step above 0; or
- its peer is the leading head, the first live one of the swarm key's lease order.

The other claims are ignored (logged at WARNING). Without a swarm key no record exists to check a
claim against, and every announcement counts, as before: not defended (docs/security.md).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from peer.runner.state_hash import HASH_EVERY
from swarm.dht import StageAnnouncement, SwarmDHT

log = logging.getLogger(__name__)

SLACK = 2 * HASH_EVERY + 2  # steps a live honest swarm can be past the newest step the swarm key vouches for
POLL_S = 0.5  # how often the announcements are read again while the swarm settles


def counted_claims(peers: Sequence[StageAnnouncement], vouched_step: int | None,
                   leader: str | None) -> tuple[list[StageAnnouncement], list[StageAnnouncement]]:
    """(the announcements whose step counts, the ignored ones). `vouched_step`: the newest step the swarm
    key vouches for (0: none yet; None: no swarm key, so every claim counts). A claim counts if its step
    is at most `vouched_step + SLACK` (0 with no vouched step) or it is the `leader`'s."""
    if vouched_step is None:
        return list(peers), []
    bound = vouched_step + SLACK if vouched_step > 0 else 0
    counted = [a for a in peers if a.step <= bound or a.peer_id == leader]
    return counted, [a for a in peers if a not in counted]


def settled_step(peers: Sequence[StageAnnouncement], waited: float, ttl: float) -> int | None:
    """The swarm's step from the counted announcements, or None while the swarm may still settle.

    A paused head announces the step it waits at as soon as it pauses. Without a head the other
    stages cannot move either; their announcements settle within one heartbeat (`ttl / 3`)."""
    if all(a.step == 0 for a in peers):
        return 0  # a swarm that has not trained yet
    paused = [a.step for a in peers if a.stage == 0 and a.state == "paused"]
    if paused:
        return max(paused)
    if waited > 2 * ttl or waited > ttl / 3 + 1 and not any(a.stage == 0 for a in peers):
        return max(a.step for a in peers)
    return None


async def newest_vouched_step(sdht: SwarmDHT, run_hash: str) -> int:
    """The newest step the swarm key vouches for a state hash or a snapshot of any stage at (0: none, or unreadable)."""
    newest = 0
    for states in (False, True):
        try:
            vouched = await sdht.fetch_vouched(run_hash, states=states)
        except Exception as e:  # a DHT hiccup: no record read, so only the leader's claim and step 0 count
            log.debug("could not read the vouched %s: %s", "states" if states else "snapshots", e)
            continue
        if vouched is not None:
            newest = max(newest, max(vouched.steps, default=0))
    return newest


async def swarm_step(read: Callable[[], Awaitable[list[StageAnnouncement]]],
                     lease_order: Callable[[], Awaitable[list[str] | None]],
                     vouched_step: Callable[[], Awaitable[int]], ttl: float, stage: int) -> int:
    """The step the swarm is on, for `stage`, which had no live replica (so the swarm is paused).

    `read`: the other peers' live announcements, every stage; `lease_order`: the swarm key's lease order
    (None: no swarm key; then every claim counts and `vouched_step` is not asked)."""
    order = await lease_order()
    vouched = await vouched_step() if order is not None else None
    warned: set[str] = set()
    t0 = time.monotonic()
    while True:
        peers = await read()
        order = await lease_order() if vouched is not None else None
        live = {a.peer_id for a in peers}
        leader = next((p for p in order or [] if p in live), None)
        counted, ignored = counted_claims(peers, vouched, leader)
        news = [a for a in ignored if a.peer_id not in warned]
        if news:
            warned.update(a.peer_id for a in news)
            log.warning("stage %d: ignored the step that %s announced: past what the swarm key's records support "
                        "(newest vouched step %d, slack %d), and not the leading head's", stage,
                        ", ".join(f"{a.peer_id[-8:]} (stage {a.stage}, step {a.step})" for a in news), vouched, SLACK)
        step = settled_step(counted, time.monotonic() - t0, ttl)
        if step is not None:
            return step
        await asyncio.sleep(POLL_S)  # poll the announcements while the swarm settles

"""`VouchedStates`: a joiner's check that the state a donor serves is one the swarm had.

After every step the leading head tallies the replicas' state hashes and the coordinator
vouches for each stage's agreed one (`peer/checks/state_votes.py`, `swarm/replicas/vouched.py`): step
-> sha256 of the stage's state after that many steps, for the newest few steps. A joiner

- skips a donor that announces a step past the newest vouched one by more than `slack` (the
  records lag the swarm: states are hashed every `HASH_EVERY` steps, and a record takes a step to
  come through the coordinator): a step the records do not know is a lie, and such a
  donor would be tried first (donors are tried in order of announced step and throughput);
- after a download, waits (at most `wait` seconds) until the records hold the state's step and
  loads the state only if its sha256 is the vouched one. A donor's own sha256 of what it
  serves proves only that it agrees with itself. A step the records have passed without
  vouching for it (one that is not hashed, which only a hostile or outdated donor serves a
  joiner, state/state_transfer.py; one the stage did not agree on) is refused at once: the coordinator vouches only for
  a step newer than every one it vouched for, so its record is not coming, and the joiner
  tries the next donor instead of waiting out `wait` while the swarm goes on.

With no record at all (a swarm before its first step, or a coordinator that does not vouch) nothing
can be checked and the state is taken on the donor's word, as before vouching; the log says so. Not
while `unchecked` says no (no coordinator holds the seat: the records are then the ones the lease's
heads signed, swarm/replicas/head_vouched.py, and one is made every few steps): the joiner waits
for one as for the record of its step, and refuses the state if none comes within `wait`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from peer.runner.state_hash import HASH_EVERY

log = logging.getLogger(__name__)


class VouchedStates:
    def __init__(self, hashes: Callable[[], Awaitable[dict[int, str]]], *, wait: float = 60.0, poll: float = 0.5,
                 slack: int = 2 * HASH_EVERY + 2, every: int | None = None,
                 unchecked: Callable[[], Awaitable[bool]] | None = None) -> None:
        # every: the steps between two state hashes of the stage's replicas (`StateHasher.every`); a state at
        # another step is refused at once, since no record of it can come (None: not known, wait for it)
        self.hashes, self.wait, self.poll, self.slack, self.every = hashes, wait, poll, slack, every
        # unchecked: whether a state may be taken unchecked while no record holds any hash (None: always)
        self.unchecked = unchecked

    async def donor_problem(self, announced_step: int) -> str | None:
        """Why a donor that announces `announced_step` is not asked, or None."""
        known = await self.hashes()
        if known and announced_step > max(known) + self.slack:
            return (f"it announces step {announced_step}, which the swarm's records do not know (the newest vouched "
                    f"state is at step {max(known)})")
        return None

    async def check(self, step: int, sha256: str) -> str | None:
        """Why a state at `step` (steps applied) with this sha256 is refused, or None to load it."""
        deadline = time.monotonic() + self.wait
        while True:
            known = await self.hashes()
            if not known:
                if self.unchecked is None or await self.unchecked():
                    log.warning("no state hash is vouched for yet: the state at step %d is taken unchecked", step)
                    return None
                if time.monotonic() > deadline:
                    return (f"no coordinator vouches for states, and no head the leader lease names has signed the "
                            f"hash of its step {step} (nor any other) within {self.wait:.0f} s")
                await asyncio.sleep(self.poll)  # a head's record is made every few steps, and re-served by peers
                continue
            if step in known:
                if known[step] == sha256:
                    return None
                return f"its sha256 differs from the one the swarm's records hold for step {step}"
            if step < min(known):
                return f"its step {step} is older than every step the swarm's records hold ({min(known)}-{max(known)})"
            if self.every and step % self.every:
                # a donor serves a step between two hashed ones only when its stage is not stepping (a paused
                # swarm, or one that finished: an export's state); no record of such a step is ever made
                return (f"no record vouches for its step {step}, and none will: the replicas hash their state "
                        f"every {self.every} steps")
            if step < max(known):
                # the coordinator vouches only for a step newer than every one it vouched for (swarm/replicas/
                # vouched.py): once the records are past this step, no record of it is coming (a step that is
                # not hashed, served by a donor the swarm left behind; a step the stage did not agree on)
                return (f"no record vouches for its step {step}, and none will: the swarm's records are past it "
                        f"({min(known)}-{max(known)})")
            if time.monotonic() > deadline:
                return f"no record vouches for its step {step} (the newest vouched state is at step {max(known)})"
            await asyncio.sleep(self.poll)  # the record of the step is on its way through the coordinator

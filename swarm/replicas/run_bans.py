"""`RunBans`: the peers this peer holds banned for the run, and the bans the swarm key lifted.

A ban for the run comes from the leading head's conviction (`peer/checks/spot_checks.py`: false,
withheld or too slow work), named in its aborts; the leader knows why (its reason), the others
only that. `swarm unban PEER` (the holder of the swarm key) stores a `Pardons` record, peer id ->
the time of its pardon, which every router reads with the leader lease (`Router.lease`). A ban
told here at time b is lifted by a pardon of time t when

    b <= t + PARDON_GRACE_S

so an abort that still named the peer because its leader had not read the pardon yet (the next
lease read, a few seconds) does not ban it again; a conviction later than that holds (the peer
lied again). Times are wall-clock seconds: machines' clocks may differ by a few seconds, far
inside the grace.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PARDON_GRACE_S = 60.0


class RunBans:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.at: dict[str, float] = {}  # banned peer -> when this peer was told
        self.reasons: dict[str, str] = {}  # banned peer -> why, where this peer knows it (the leader does)
        self.pardons: dict[str, float] = {}  # the swarm key's pardons read so far: peer -> time of the pardon
        self.on_pardon: list[Callable[[str], None]] = []  # called once per pardon read (the leader's checks)

    def __contains__(self, peer: str) -> bool:
        return peer in self.at

    def add(self, peer: str, why: str = "") -> bool:
        """Ban `peer` for the run; False if a pardon given just before covers it (or it was banned already)."""
        now = self.clock()
        if peer in self.pardons and now <= self.pardons[peer] + PARDON_GRACE_S:
            log.debug("peer %s was named banned after its pardon: an abort from before the leader read it", peer[-8:])
            return False
        if why:
            self.reasons[peer] = why
        if peer in self.at:
            return False
        self.at[peer] = now
        return True

    def pardon(self, pardons: dict[str, float]) -> list[str]:
        """Take the swarm key's pardons; the peers whose ban here they lifted."""
        lifted = []
        for peer, t in pardons.items():
            if self.pardons.get(peer) == t:
                continue
            self.pardons[peer] = t
            for call in self.on_pardon:
                call(peer)
            if peer in self.at and self.at[peer] <= t + PARDON_GRACE_S:
                del self.at[peer]
                self.reasons.pop(peer, None)
                lifted.append(peer)
                log.warning("the swarm's operator lifted peer %s's ban for the run (swarm unban): it may take part "
                            "again", peer[-8:])
        return lifted

    def listed(self) -> dict[str, str]:
        """Banned peer -> why ("" where this peer was not told)."""
        return {peer: self.reasons.get(peer, "") for peer in self.at}

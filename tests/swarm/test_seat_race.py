"""Two coordinators that claim the seat at once while the DHT stores slowly (swarm/coordinator/seat.py): a claim
whose store took longer than the settle (as on a loaded machine) must not let both believe they hold the seat.
Seen under load in tests/swarm/test_coordinator_seat.py ("both coordinators hold the seat"): the fast claimant
settled and read before the slow one's claim arrived, and the slow one, of the lower peer id, read both and took
the seat by the rule. The DHT here is an in-memory double whose stores take a set time per claimant."""
from __future__ import annotations

import asyncio
import random

from hivemind.utils import get_dht_time

from swarm.coordinator.seat import CoordinatorSeat
from swarm.dht import CoordinatorClaim

RUN = "run"
FAST = dict(ttl=2.0, renew_s=0.3, poll_s=0.1, settle_s=0.2, margin_s=0.5)


class SlowClaims:
    """The claims of one run, shared by every coordinator's view; `delay` seconds before each store lands."""

    def __init__(self) -> None:
        self.claims: dict[str, CoordinatorClaim] = {}


class SeatDHT:
    def __init__(self, shared: SlowClaims, delay: float) -> None:
        self.shared, self.delay, self.seat_fence = shared, delay, None

    async def publish_claim(self, claim: CoordinatorClaim, ttl: float) -> bool:
        await asyncio.sleep(self.delay)  # the store's round trips
        self.shared.claims[claim.peer_id] = claim
        return True

    async def fetch_claims(self, run_hash: str) -> list[CoordinatorClaim]:
        return list(self.shared.claims.values())


async def _holders_over(seats: list[CoordinatorSeat], seconds: float) -> tuple[set[str], int]:
    """Run both coordinators as the daemon does (hold, then watch until lost, then hold again) for `seconds`;
    the peer ids that held the seat at some moment, and the most that could sign at one moment."""
    held: set[str] = set()

    async def life(seat: CoordinatorSeat) -> None:
        while True:
            await seat.hold()
            held.add(seat.peer_id)
            await seat.watch()

    tasks = [asyncio.create_task(life(s)) for s in seats]
    most = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    try:
        while loop.time() < end:
            most = max(most, sum(s.may_sign() for s in seats))
            await asyncio.sleep(0.01)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return held, most


async def test_a_slow_claim_of_the_lower_id_does_not_take_the_seat_the_fast_one_already_holds():
    shared = SlowClaims()
    fast = CoordinatorSeat(SeatDHT(shared, 0.0), RUN, "zz-fast", **FAST)
    slow = CoordinatorSeat(SeatDHT(shared, 3 * FAST["settle_s"]), RUN, "aa-slow", **FAST)  # wins the id tie
    held, most = await _holders_over([fast, slow], 2.0)
    assert most == 1, "two coordinators could sign at one moment"
    assert held == {"zz-fast"}, f"the seat went to {sorted(held)}; the fast claimant had it and kept renewing"
    claim = max(shared.claims.values(), key=lambda c: c.term)
    assert claim.peer_id == "zz-fast" and claim.until > get_dht_time() - FAST["ttl"]


async def test_two_slow_claims_at_once_both_stand_by_and_a_later_round_seats_exactly_one():
    shared = SlowClaims()
    slow = {**FAST, "poll_s": 1.0}  # rounds 0.5-1.5 s apart, stores of 0.3 s: the jitter parts the rivals
    a = CoordinatorSeat(SeatDHT(shared, 0.3), RUN, "aa", **slow)
    b = CoordinatorSeat(SeatDHT(shared, 0.3), RUN, "bb", **slow)
    a._jitter, b._jitter = random.Random(1), random.Random(2)  # the same draws every run
    held, most = await _holders_over([a, b], 5.0)
    assert most == 1, "two coordinators could sign at one moment"
    assert len(held) == 1, f"the seat changed hands with both alive: {sorted(held)}"
    winner = next(iter(held))
    assert max(shared.claims.values(), key=lambda c: (c.term, c.until)).peer_id == winner


"""The seat of the active coordinator (swarm/coordinator/seat.py, issue 56 item 1), over two real hivemind DHT
nodes on 127.0.0.1: of two coordinators with one swarm key exactly one holds the seat, also when both claim
at once; a holder that stops renewing (paused) loses it to the standby within the bound, and once its fence
has shut it signs nothing more, and stands by when it resumes."""
from __future__ import annotations

import asyncio
import time

import pytest
from hivemind.utils import get_dht_time

from protocol.spec import preset
from swarm.coordinator.seat import CoordinatorSeat
from swarm.dht import ActiveCoordinator, LeaderLease, SwarmDHT, seat_holder, start_dht, stop_dht
from swarm.dht.swarm_records import SeatLost
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
pytestmark = pytest.mark.e2e  # real DHT nodes
RUN = preset("tiny", stages=2).run_hash
FAST = dict(ttl=3.0, renew_s=0.4, poll_s=0.3, settle_s=0.8, margin_s=1.0)  # the bound: ttl + poll + settle = 4.1 s


@pytest.fixture
def two():
    """Two DHT nodes, each a coordinator's SwarmDHT with the same swarm key."""
    key, dhts = SigningKey.generate(), []
    try:
        ids = Identity.generate(), Identity.generate()
        dhts.append(start_dht([], host_maddrs=LOCAL, identity=ids[0]))
        maddrs = [str(m) for m in dhts[0].get_visible_maddrs()]
        dhts.append(start_dht(maddrs, host_maddrs=LOCAL, identity=ids[1]))
        yield [(SwarmDHT(d, i, swarm_key=key), i.peer_id) for d, i in zip(dhts, ids)]
    finally:
        for dht in dhts:
            stop_dht(dht)


async def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout} s")
        await asyncio.sleep(0.1)
    return found


async def _cancel(*tasks: asyncio.Task) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_two_coordinators_that_claim_at_once_leave_exactly_one_in_the_seat(two):
    (a, id_a), (b, id_b) = two
    seats = [CoordinatorSeat(a, RUN, id_a, **FAST), CoordinatorSeat(b, RUN, id_b, **FAST)]
    holds = [asyncio.create_task(s.hold()) for s in seats]  # the same moment: both may read no claim
    watches = []
    try:
        done, _ = await asyncio.wait(holds, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        assert done, "neither coordinator took the seat"
        winner = seats[holds.index(next(iter(done)))]
        loser = seats[1 - seats.index(winner)]
        watches = [asyncio.create_task(winner.watch())]
        await asyncio.sleep(3 * FAST["settle_s"] + FAST["ttl"])  # long enough for a second holder to appear
        assert sum(t.done() for t in holds) == 1, "both coordinators hold the seat"
        assert winner.may_sign() and not loser.may_sign()
        with pytest.raises(SeatLost):
            await loser.sdht.publish_lease(LeaderLease(RUN, 1, []), 60.0)
        assert await winner.sdht.publish_lease(LeaderLease(RUN, 1, []), 60.0)
        for reader in (a, b):  # every reader applies the same rule and names the winner
            held = seat_holder(await reader.fetch_claims(RUN), get_dht_time())
            assert held is not None and held.peer_id == winner.peer_id and held.term == winner.term
        assert loser.holder is not None and loser.holder.peer_id == winner.peer_id  # what its log names
    finally:
        await _cancel(*holds, *watches)


async def test_a_paused_holder_loses_the_seat_within_the_bound_and_signs_nothing_when_it_resumes(two):
    (a, id_a), (b, id_b) = two
    first, standby = CoordinatorSeat(a, RUN, id_a, **FAST), CoordinatorSeat(b, RUN, id_b, **FAST)
    claim = await asyncio.wait_for(first.hold(), 20)
    watch = asyncio.create_task(first.watch())
    waiting = asyncio.create_task(standby.hold())
    tasks = [watch, waiting]
    try:
        await asyncio.sleep(2 * FAST["ttl"])  # the holder renews: the standby keeps standing by
        assert not waiting.done() and first.may_sign()
        assert standby.holder is not None and standby.holder.peer_id == id_a

        await _cancel(watch)  # "paused": no renewal, nothing runs on its side
        paused = time.monotonic()
        taken = await asyncio.wait_for(waiting, 20)
        took = time.monotonic() - paused
        bound = FAST["ttl"] + FAST["poll_s"] + FAST["settle_s"] + 2.0  # + two DHT round trips' slack
        assert took <= bound, f"the standby took the seat {took:.1f} s after the holder stopped (bound {bound:.1f})"
        assert taken.term == claim.term + 1 and taken.peer_id == id_b
        tasks.append(asyncio.create_task(standby.watch()))

        # "resumed": its fence shut before the standby could take over, so nothing it signs now lands
        assert not first.may_sign()
        for sign in (lambda: a.publish_lease(LeaderLease(RUN, 9, []), 60.0),
                     lambda: a.publish_basis(RUN, 1, b"u", 60.0), lambda: a.publish_run_spec("{}", a.swarm_key, 60.0)):
            with pytest.raises(SeatLost):
                await sign()
        assert "lapsed" in await asyncio.wait_for(first.watch(), 5)  # its watch gives the seat up at once
        again = asyncio.create_task(first.hold())
        tasks.append(again)
        await asyncio.sleep(2 * FAST["ttl"])
        assert not again.done(), "the resumed coordinator took the seat back from a live holder"
        assert first.holder is not None and first.holder.peer_id == id_b
        reader = ActiveCoordinator(a, RUN, "spec-peer", refresh_s=0.0)
        assert await reader.peer_id() == id_b  # where peers send statistics and work records now
    finally:
        await _cancel(*tasks)


async def test_a_holder_that_resigns_hands_the_seat_over_before_its_claim_would_lapse(two):
    (a, id_a), (b, id_b) = two
    first, standby = CoordinatorSeat(a, RUN, id_a, **{**FAST, "ttl": 30.0}), CoordinatorSeat(b, RUN, id_b, **FAST)
    await asyncio.wait_for(first.hold(), 20)
    waiting = asyncio.create_task(standby.hold())
    try:
        await asyncio.sleep(1.0)
        assert not waiting.done()
        resigned = time.monotonic()
        await first.resign()
        await asyncio.wait_for(waiting, 10)
        assert time.monotonic() - resigned < 10.0  # far sooner than the 30 s its claim had left
        assert not first.may_sign()
    finally:
        await _cancel(waiting)


async def test_the_active_coordinator_falls_back_to_the_newest_claim_then_to_the_spec(two):
    (a, id_a), _ = two
    reader = ActiveCoordinator(a, RUN, "the-spec-peer", refresh_s=0.0)
    assert await reader.peer_id() == "the-spec-peer"  # no claim at all: a coordinator of an older version
    seat = CoordinatorSeat(a, RUN, id_a, **FAST)
    await asyncio.wait_for(seat.hold(), 20)
    assert await reader.peer_id() == id_a and reader.claim is not None
    await seat.resign()
    await _until(lambda: _no_live(reader), 10, "the resigned claim did not stop being live")
    assert await reader.peer_id() == id_a  # no live claim: the newest term's coordinator is still the best guess


async def _no_live(reader: ActiveCoordinator) -> bool:
    return await reader.refresh(force=True) is None

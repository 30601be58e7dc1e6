"""SendOrder: the frames of one uplink take turns first come first served, each a lease."""

from __future__ import annotations

import asyncio

import pytest

from swarm.net.send_order import SendOrder
from swarm.net.shaper import LinkShaper
from tests.swarm.test_shaper import VirtualClock


async def test_turns_come_in_the_order_frames_lined_up():
    order = SendOrder()
    turns = [order.line_up(100) for _ in range(3)]
    got: list[int] = []

    async def send(i: int) -> None:
        await turns[i].wait()
        got.append(i)
        turns[i].release()

    tasks = [asyncio.create_task(send(i)) for i in (2, 1, 0)]  # waiting in another order changes nothing
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert got == [0, 1, 2]


async def test_the_next_frame_waits_until_the_one_before_has_left():
    order = SendOrder()
    first, second = order.line_up(100), order.line_up(100)
    await asyncio.wait_for(first.wait(), 5)
    waiter = asyncio.create_task(second.wait())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done() and order.queued == 1
    first.release()
    await asyncio.wait_for(waiter, 5)
    second.release()
    assert order.queued == 0


async def test_a_frame_that_leaves_the_line_is_skipped():
    order = SendOrder()
    first, gone, third = order.line_up(1), order.line_up(1), order.line_up(1)
    waiter = asyncio.create_task(gone.wait())
    await asyncio.sleep(0)
    waiter.cancel()
    gone.release(measured=False)  # what the transport does for a request cancelled while it waits
    first.release()
    await asyncio.wait_for(third.wait(), 5)
    assert gone.started is None and third.started is not None  # the turn went past the frame that left
    third.release()


async def test_a_turn_not_given_up_within_its_lease_is_handed_on():
    order = SendOrder(lease_first_s=0.05)
    stuck, next_ = order.line_up(1000), order.line_up(1000)
    await asyncio.wait_for(stuck.wait(), 5)
    await asyncio.wait_for(next_.wait(), 5)  # the stuck frame never releases: its lease runs out
    assert order.expired == 1 and stuck.released
    assert order.rate is None  # an expired turn is not a measurement of the link
    next_.release()


async def test_the_lease_follows_the_measured_rate():
    now = [0.0]
    order = SendOrder(lease_min_s=1.0, lease_factor=4.0, clock=lambda: now[0])
    assert order.lease_s(10**6) == order.lease_first_s
    turn = order.line_up(10**6)
    await turn.wait()
    now[0] = 2.0  # 1 MB left in 2 s
    turn.release()
    assert order.rate == pytest.approx(5e5)
    assert order.lease_s(10**6) == pytest.approx(8.0)  # 4 x the 2 s it takes
    assert order.lease_s(10) == pytest.approx(1.0)  # never below the minimum
    failed = order.line_up(10**6)
    await failed.wait()
    now[0] = 100.0
    failed.release(measured=False)
    assert order.rate == pytest.approx(5e5)  # a failed write says nothing about the link


async def test_the_shaper_says_when_the_last_byte_left_before_the_latency():
    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.1, clock=clock, sleep=clock.sleep)
    left: list[float] = []
    await clock.run(shaper.transmit(1_000_000, on_sent=lambda: left.append(clock.now)))
    assert left == [pytest.approx(1.0)]  # 1 MB at 1 MB/s
    assert clock.now == pytest.approx(1.1)  # and it arrives a latency later


async def test_a_frame_holds_until_its_reply_while_it_is_longer_on_the_wire_than_four_round_trips():
    now = [0.0]
    order = SendOrder(clock=lambda: now[0])
    assert order.holds(10)  # nothing measured: hold
    for rtt in (0.3, 0.05, 0.2):
        order.note_round_trip(rtt)
    assert order.rtt == pytest.approx(0.05)  # the smallest recent one
    turn = order.line_up(10**6)
    await turn.wait()
    now[0] = 1.05  # its reply: 1 s on the wire plus the round trip
    order.note_reply(turn)
    turn.release()
    assert order.wire_rate == pytest.approx(1e6)
    assert order.holds(250_000)  # 0.25 s on the wire > 4 x 0.05 s
    assert not order.holds(150_000)  # 0.15 s < 0.2 s: let go once written


async def test_a_peer_that_measured_no_round_trip_takes_a_home_round_trip():
    """A stage that sends only gradients sends no small request to time: without the default it would
    take the round trip as 0 and hold every frame, however short, until its reply."""
    from swarm.net.send_order import DEFAULT_RTT_S, HOLD_RTTS
    now = [0.0]
    order = SendOrder(clock=lambda: now[0])
    turn = order.line_up(33_000)
    await turn.wait()
    now[0] = DEFAULT_RTT_S + 0.067  # a 33 kB frame at 4 Mbit/s and its reply
    order.note_reply(turn)
    turn.release()
    assert order.rtt is None and order.wire_rate == pytest.approx(33_000 / 0.067)
    assert not order.holds(33_000)  # 67 ms on the wire < 4 home round trips
    assert order.holds(int(order.wire_rate * HOLD_RTTS * DEFAULT_RTT_S) + 1000)


async def test_a_frame_answered_within_a_round_trip_is_short_on_the_wire():
    now = [0.0]
    order = SendOrder(clock=lambda: now[0])
    turn = order.line_up(100_000)
    await turn.wait()
    now[0] = 0.004  # a fast local link, under the default round trip
    order.note_reply(turn)
    turn.release()
    assert order.wire_rate == pytest.approx(100_000 / 1e-3)
    assert not order.holds(100_000)

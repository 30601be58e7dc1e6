"""LinkShaper and HomeLink timing on a virtual clock (no wall-clock figures), and the CLI parsers."""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import random

import pytest

from swarm.net.home_link import HORIZON_S, DownlinkShaper, HomeLink, Packets
from swarm.net.shaper import MIN_BUCKET_BYTES, LinkShaper, parse_bandwidth, parse_latency


class VirtualClock:
    """A clock that only moves when every task is asleep: then it jumps to the next wake-up."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self._sleepers: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + delay, next(self._order), future))
        await future

    async def run(self, *coros) -> list:
        tasks = [asyncio.ensure_future(c) for c in coros]
        while not all(t.done() for t in tasks):
            for _ in range(10):  # let every runnable task reach its next sleep
                await asyncio.sleep(0)
            if self._sleepers:
                wake, _, future = heapq.heappop(self._sleepers)
                self.now = max(self.now, wake)
                future.set_result(None)
        return [t.result() for t in tasks]


async def timed(clock: VirtualClock, shaper: LinkShaper, nbytes: int) -> float:
    await shaper.transmit(nbytes)
    return clock.now


async def test_one_megabyte_at_8mbit_takes_one_second():
    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.0, clock=clock, sleep=clock.sleep)
    (done,) = await clock.run(timed(clock, shaper, 1_000_000))
    assert done == pytest.approx(1.0, rel=0.01)


async def test_latency_is_added_exactly_once():
    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.020, clock=clock, sleep=clock.sleep)
    (done,) = await clock.run(timed(clock, shaper, 1_000_000))
    assert done == pytest.approx(1.020, abs=1e-9)
    assert clock.sleeps == [pytest.approx(1.0), pytest.approx(0.020)]  # serialization, then latency once


async def test_concurrent_sends_share_the_bandwidth_and_overlap_latency():
    """Frames in flight together share the rate (as interleaved TCP packets do): two 500 kB frames
    at 8 Mbit/s both leave after 1 s; their latencies overlap."""
    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.0, clock=clock, sleep=clock.sleep)
    first, second = await clock.run(timed(clock, shaper, 500_000), timed(clock, shaper, 500_000))
    assert (first, second) == (pytest.approx(1.0), pytest.approx(1.0))

    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.1, clock=clock, sleep=clock.sleep)
    first, second = await clock.run(timed(clock, shaper, 500_000), timed(clock, shaper, 500_000))
    # Latency overlaps: neither message is delayed by the other one's 0.1 s of flight.
    assert (first, second) == (pytest.approx(1.1), pytest.approx(1.1))


async def test_a_small_frame_is_not_stuck_behind_a_large_one():
    """A 1 kB reply sent 0.1 s into a 1 MB transfer gets half the rate: it leaves ~2 ms later, and
    the large frame finishes 1 ms after it would have alone."""
    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.0, clock=clock, sleep=clock.sleep)

    async def later(nbytes: int, at: float) -> float:
        await clock.sleep(at)
        return await timed(clock, shaper, nbytes)

    large, small = await clock.run(timed(clock, shaper, 1_000_000), later(1_000, 0.1))
    assert small == pytest.approx(0.1 + 2 * 1_000 / 1e6)
    assert large == pytest.approx(1.0 + 1_000 / 1e6)
    assert shaper.in_flight == 0


async def test_frames_of_different_sizes_leave_in_size_order():
    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.0, clock=clock, sleep=clock.sleep)
    a, b, c = await clock.run(*(timed(clock, shaper, n) for n in (300_000, 100_000, 200_000)))
    # three share until b leaves (3 x 100 kB), two until c (2 x 100 kB), then a alone (100 kB)
    assert (b, c, a) == (pytest.approx(0.3), pytest.approx(0.5), pytest.approx(0.6))


async def test_idle_link_earns_at_most_one_bucket_of_burst():
    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.0, clock=clock, sleep=clock.sleep)
    clock.now = 100.0  # a long idle period
    (done,) = await clock.run(timed(clock, shaper, 1_000_000))
    assert done - 100.0 == pytest.approx((1_000_000 - MIN_BUCKET_BYTES) / 1e6, rel=1e-6)
    small = LinkShaper(8e6, 0.0, clock=clock, sleep=clock.sleep)
    clock.now += 1.0
    await clock.run(timed(clock, small, 1000))
    assert len(clock.sleeps) == 1  # the 1000-byte send fitted in the burst and did not sleep


async def test_unlimited_link_has_zero_delay():
    clock = VirtualClock()
    shaper = LinkShaper(None, 0.0, clock=clock, sleep=clock.sleep)
    results = await clock.run(*(timed(clock, shaper, 10_000_000) for _ in range(3)))
    assert results == [0.0, 0.0, 0.0]
    assert clock.sleeps == []
    assert shaper.unlimited
    assert LinkShaper.from_strings("unlimited", "0").unlimited
    assert LinkShaper.from_strings(None, None).unlimited
    assert not LinkShaper.from_strings("80mbit", None).unlimited


async def test_unlimited_bandwidth_still_has_latency():
    clock = VirtualClock()
    shaper = LinkShaper(None, 0.05, clock=clock, sleep=clock.sleep)
    first, second = await clock.run(timed(clock, shaper, 10**9), timed(clock, shaper, 10**9))
    assert (first, second) == (pytest.approx(0.05), pytest.approx(0.05))


async def test_time_scales_with_bytes():
    clock = VirtualClock()
    shapers = [LinkShaper(8e6, 0.0, clock=clock, sleep=clock.sleep) for _ in range(2)]
    one, four = await clock.run(timed(clock, shapers[0], 100_000), timed(clock, shapers[1], 400_000))
    assert (one, four) == (pytest.approx(0.1), pytest.approx(0.4))


def home(clock: VirtualClock, bandwidth: str = "8mbit", latency: str = "0", packets=None) -> HomeLink:
    """A HomeLink on the virtual clock; frame bytes alone unless `packets` says how they become packets."""
    return HomeLink.from_strings(bandwidth, latency, packets=packets, clock=clock, sleep=clock.sleep)


async def sent(clock: VirtualClock, link: HomeLink, nbytes: int, at: float = 0.0) -> float:
    await clock.sleep(at)
    await link.send(nbytes)
    return clock.now


async def received(clock: VirtualClock, link: HomeLink, nbytes: int, at: float) -> float:
    """A frame whose last byte reaches this peer at `at` (the sender's uplink and latency done)."""
    await clock.sleep(at)
    await link.receive(nbytes)
    return clock.now


async def test_every_frame_a_peer_sends_shares_its_one_uplink():
    """Two frames to two destinations (or a request and a reply): one uplink, so they queue."""
    clock = VirtualClock()
    link = home(clock, latency="20ms")
    to_a, to_b = await clock.run(sent(clock, link, 500_000), sent(clock, link, 500_000))
    assert (to_a, to_b) == (pytest.approx(1.020), pytest.approx(1.020))  # 1 MB through one 1 MB/s uplink


async def test_one_stream_pays_the_downlink_nothing_extra():
    """Frames arriving back to back at the uplink's rate: the downlink (same rate) keeps up."""
    clock = VirtualClock()
    link = home(clock)
    frames = [received(clock, link, 500_000, at=0.5 * (i + 1)) for i in range(4)]
    assert await clock.run(*frames) == [pytest.approx(0.5 * (i + 1)) for i in range(4)]


async def test_two_senders_share_one_downlink():
    """Two 1 MB frames from two senders, each at 8 Mbit/s, both fully sent at t = 1 s: the receiver's
    8 Mbit/s downlink carried 1 MB by then, the second megabyte takes 1 s more."""
    clock = VirtualClock()
    link = home(clock)
    first, second = await clock.run(received(clock, link, 1_000_000, 1.0), received(clock, link, 1_000_000, 1.0))
    assert first == pytest.approx(1.0)
    assert second == pytest.approx(2.0)


async def test_a_small_frame_right_behind_a_large_one_is_not_charged_the_large_ones_time_again():
    """The sender's uplink took the 1 MB frame's second already, while its bytes flowed in: a command
    that follows it from the same sender arrives at once, not a second later (the downlink double-charged
    that second before, and a leader's apply that followed a contribution came after the next reduce)."""
    clock = VirtualClock()
    link = home(clock)
    assert await clock.run(received(clock, link, 1_000_000, 1.0), received(clock, link, 100, 1.0002)) == [
        pytest.approx(1.0), pytest.approx(1.0002)]


async def test_a_frame_waits_only_for_the_overlap_of_its_transfer_with_anothers():
    """1 MB in over [0, 1] s and 0.5 MB from another sender over [0.75, 1.25] s: they shared the downlink
    for 0.25 s, so the second is through at 1.5 s (the whole backlog of the first would make it 2.0 s)."""
    clock = VirtualClock()
    link = home(clock)
    assert await clock.run(received(clock, link, 1_000_000, 1.0), received(clock, link, 500_000, 1.25)) == [
        pytest.approx(1.0), pytest.approx(1.5)]


async def test_a_small_frame_that_came_in_during_a_large_ones_transfer_costs_it_only_its_own_time():
    """1 MB in over [0, 1] s; a 100-byte reply from another sender done at 0.5 s, read first: the large
    frame is through at 1.0001 s (the reply's 0.1 ms of line time), not at 1.5 s (the old "free at" rule
    started the large frame after the reply, which made every activation of a link-bound run wait)."""
    clock = VirtualClock()
    link = home(clock)
    assert await clock.run(received(clock, link, 100, 0.5), received(clock, link, 1_000_000, 1.0)) == [
        pytest.approx(0.5), pytest.approx(1.0001)]


async def test_a_busy_downlink_keeps_the_order_of_what_queued():
    """Three 1 MB frames from three senders, all in at 1 s: through at 1, 2 and 3 s; a 100-byte frame in at
    1.5 s waits behind what is queued (through at 3.0001 s): the queue's work, not only overlaps."""
    clock = VirtualClock()
    link = home(clock)
    got = await clock.run(*(received(clock, link, 1_000_000, 1.0) for _ in range(3)),
                          received(clock, link, 100, 1.5))
    assert got == [pytest.approx(1.0), pytest.approx(2.0), pytest.approx(3.0), pytest.approx(3.0001)]


async def test_packets_take_headers_and_acknowledgements_take_the_other_side():
    """1 MB in 1448-byte segments: 691 headers of 66 bytes on the sender's uplink; the receiver
    acknowledges every second segment (346 bare ACKs) on its uplink."""
    packets = Packets()
    assert packets.on_line(1_000_000) == 1_000_000 + 691 * 66 and packets.acks(1_000_000) == 346 * 66
    clock = VirtualClock()
    sender, receiver = home(clock, packets=packets), home(clock, packets=packets)
    (done,) = await clock.run(sent(clock, sender, 1_000_000))
    assert done == pytest.approx(packets.on_line(1_000_000) / 1e6)
    await clock.run(received(clock, receiver, 1_000_000, at=0.0))
    assert receiver.stats()["uplink_bytes"] == 346 * 66 and receiver.stats()["downlink_bytes"] == 1_045_606
    assert sender.stats()["downlink_bytes"] == 346 * 66  # its ACKs came back on its downlink


async def test_acknowledgements_take_their_share_of_the_uplink():
    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.0, clock=clock, sleep=clock.sleep)
    shaper.occupy(500_000)  # nobody waits for these bytes, but they share the line
    (done,) = await clock.run(timed(clock, shaper, 500_000))
    assert done == pytest.approx(1.0) and shaper.in_flight == 0 and shaper.bytes == 1_000_000


async def test_busy_time_is_bytes_at_the_line_rate():
    clock = VirtualClock()
    link = home(clock)
    await clock.run(sent(clock, link, 1_000_000), sent(clock, link, 30_000, at=10.0),
                    received(clock, link, 500_000, at=3.0))
    assert link.uplink.busy_s == pytest.approx(1.03)  # a burst's bytes take line time too
    assert link.downlink.busy_s == pytest.approx(0.5)
    assert link.stats() == {"uplink_bytes": 1_030_000, "uplink_busy_s": pytest.approx(1.03),
                            "downlink_bytes": 500_000, "downlink_busy_s": pytest.approx(0.5)}
    assert home(clock, "unlimited").unlimited and not home(clock).unlimited


@pytest.mark.parametrize(
    "text, bps",
    [
        ("80mbit", 80e6),
        ("80Mbit", 80e6),
        ("1gbit", 1e9),
        ("500kbit", 500e3),
        ("10MB/s", 80e6),
        ("1.5 mbps", 1.5e6),
        ("2MiB/s", 16 * 2**20),
        (1e6, 1e6),
    ],
)
def test_parse_bandwidth(text, bps):
    assert parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("text", ["unlimited", "Unlimited", None, "none"])
def test_parse_bandwidth_unlimited(text):
    assert parse_bandwidth(text) is None


@pytest.mark.parametrize("text", ["80", "fast", "", "-5mbit", "0mbit", "10furlongs", "mbit", True, [1]])
def test_parse_bandwidth_errors(text):
    with pytest.raises(ValueError) as info:
        parse_bandwidth(text)
    assert str(info.value).endswith(".")


@pytest.mark.parametrize(
    "text, seconds", [("20ms", 0.020), ("0.02s", 0.02), ("0", 0.0), ("150us", 150e-6), (0.1, 0.1), ("1.5 s", 1.5)]
)
def test_parse_latency(text, seconds):
    assert parse_latency(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["20", "soon", "", "-1ms", "5 parsecs", "nan", None, False])
def test_parse_latency_errors(text):
    with pytest.raises(ValueError) as info:
        parse_latency(text)
    assert str(info.value).endswith(".")


def test_shaper_rejects_nonsense():
    with pytest.raises(ValueError):
        LinkShaper(0)
    with pytest.raises(ValueError):
        LinkShaper(1e6, -0.1)
    with pytest.raises(ValueError):
        asyncio.run(LinkShaper(1e6).transmit(-1))
    with pytest.raises(ValueError):
        DownlinkShaper(1e6).queue_delay_for(-1)


def test_the_downlink_stops_its_scan_early_and_still_waits_what_a_scan_of_every_interval_gives():
    """`DownlinkShaper` scans its busy intervals from the newest back and stops where none before can overlap
    the arriving frame: arrivals of mixed sizes (large ones, whose queue puts some ends out of order, then many
    small ones, thousands of intervals kept) get, bit for bit, the waits of the module docstring's formula summed
    over every kept interval, as before the early stop."""
    rng, clock = random.Random(3), [0.0]
    link = DownlinkShaper(8e6, clock=lambda: clock[0])
    busy: collections.deque = collections.deque()  # the formula over every interval, kept as long as the link does
    out_of_order = 0  # arrivals through before a frame received earlier: what the scan's bound must allow for
    for per_second, sizes in ((1.0, (1000, 200_000, 2_000_000)), (100.0, (64, 1500))):
        for _ in range(3000):
            clock[0] += rng.expovariate(per_second)
            nbytes = rng.choice(sizes)
            now, own = clock[0], nbytes / 1e6
            while busy and busy[0][1] < now - max(HORIZON_S, 2 * 2.0):  # 2.0 s: the longest frame
                busy.popleft()
            began = now - own
            through = max(now, began + own + sum(end - max(start, began) for start, end in busy if end > began))
            out_of_order += bool(busy) and through < max(end for _, end in busy)
            busy.append((through - own, through))
            assert link.queue_delay_for(nbytes) == through - now
    assert out_of_order > 5 and len(busy) > 2000

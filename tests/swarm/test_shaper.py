"""LinkShaper timing (virtual clock, plus one real-loop ratio check) and the CLI parsers."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time

import pytest

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
    assert len(clock.sleeps) == 1


async def test_concurrent_sends_queue_for_bandwidth_but_overlap_latency():
    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.0, clock=clock, sleep=clock.sleep)
    first, second = await clock.run(timed(clock, shaper, 500_000), timed(clock, shaper, 500_000))
    assert first == pytest.approx(0.5, rel=0.01)
    assert second == pytest.approx(1.0, rel=0.01)

    clock = VirtualClock()
    shaper = LinkShaper(8e6, 0.1, clock=clock, sleep=clock.sleep)
    first, second = await clock.run(timed(clock, shaper, 500_000), timed(clock, shaper, 500_000))
    # Latency overlaps: the second message is not delayed by the first one's 0.1 s of flight.
    assert first == pytest.approx(0.6, rel=0.01)
    assert second == pytest.approx(1.1, rel=0.01)


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


async def test_real_loop_time_scales_with_bytes():
    async def measure(nbytes: int) -> float:
        shaper = LinkShaper(8e6, 0.0)  # fresh, empty bucket each time
        start = time.monotonic()
        await shaper.transmit(nbytes)
        return time.monotonic() - start

    one = await measure(60_000)
    four = await measure(240_000)
    assert 3.0 <= four / one <= 5.5, (one, four)


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
        LinkShaper(1e6).delay_for(-1)

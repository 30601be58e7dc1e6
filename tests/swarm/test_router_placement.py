"""The router's bans and probation, on a directory given in memory (no DHT); placement: test_placement_balance.py."""
from __future__ import annotations

import time

from protocol.wire import KIND_DRIVE, KIND_REDUCE
from swarm.dht import StageAnnouncement
from swarm.replicas.membership import Membership
from swarm.replicas.router import (
    BAD_DATA_BAN_S,
    FRESH_READ_S,
    NEAR_TIE,
    PROBATION_PAUSE_FACTOR,
    RTT_FORGET_S,
    UNPROVEN_BAN_FACTOR,
    Router,
)


class Directory(Router):
    """A Router whose announcements come from a dict instead of the DHT."""

    def __init__(self, peer_id: str, table: dict[int, list[tuple[str, float]]]) -> None:
        super().__init__(dht=None, run_hash="r", peer_id=peer_id, maddrs=[])
        self.table = table

    async def announced(self, stage: int, fresh: bool = False, recent: bool = False) -> list[StageAnnouncement]:
        return [StageAnnouncement(p, "r", stage, [], t, 0, 0, "online", "0") for p, t in self.table.get(stage, [])]

    async def lease_order(self, fresh: bool = False) -> list[str]:
        return [p for p, _ in self.table.get(0, [])]

    async def admitted(self, peer: str) -> bool:  # the DHT's side of Membership: an open swarm
        return True


def test_a_burst_of_failures_inside_one_ban_counts_once():
    r = Directory("me", {})
    r.release("peer", 0.1)  # it returned work: proven, so its bans start at base_ban
    for _ in range(6):  # every microbatch of one step refused at once
        r.report_failure("peer")
    assert r.banned_peers() == {"peer": 1}
    assert r.is_banned("peer") and r._bans["peer"].until - time.monotonic() <= r.base_ban
    r._bans["peer"].until = time.monotonic() - 1  # the ban ran out; the next failure doubles it
    r.report_failure("peer")
    assert r.banned_peers() == {"peer": 2} and r._bans["peer"].until - time.monotonic() > r.base_ban


def test_bad_data_bans_for_longer_than_any_retry():
    r = Directory("me", {})
    r.report_failure("liar", bad_data=True)
    assert r._bans["liar"].until - time.monotonic() > BAD_DATA_BAN_S - 1


async def test_a_peer_avoided_only_for_failing_is_taken_back_once_shown_alive_and_a_bad_data_ban_stays():
    """A standby head that missed the leader's answers avoids it; once the swarm is seen going on under it, the
    head takes it back (peer/step/driver.py), or it would refuse the leader's commands until the ban ends."""
    r = Directory("me", {0: [("leader", 1.0), ("liar", 1.0)]})
    r.release("leader", 0.1)  # proven
    r.report_failure("leader")
    assert r.is_banned("leader") and [a.peer_id for a in await r.live_peers(0)] == ["liar"]
    r.forgive_failure("leader")
    assert not r.is_banned("leader") and sorted(a.peer_id for a in await r.live_peers(0)) == ["leader", "liar"]
    r.report_failure("leader")  # its count stayed: the next ban is twice as long
    assert r.banned_peers()["leader"] == 2 and r._bans["leader"].until - time.monotonic() > r.base_ban
    r.report_failure("liar", bad_data=True)
    r.forgive_failure("liar")
    assert r.is_banned("liar") and r._bans["liar"].until - time.monotonic() > BAD_DATA_BAN_S - 1
    r._bans["liar"].until = time.monotonic() - 1  # that ban ran out; a later ban for failing only may be lifted
    r.report_failure("liar")
    r.forgive_failure("liar")
    assert not r.is_banned("liar")


async def test_unproven_replicas_share_one_probation_slot_while_a_proven_one_serves():
    fakes = [f"fake{i:02d}" for i in range(40)]
    r = Directory("me", {1: [("honest", 1.0)] + [(f, 1e9) for f in fakes]})
    r.release("honest", 0.2)  # it returned a gradient: proven
    r._in_flight["honest"] = 0
    picks = [await r.pick(1) for _ in range(8)]  # a step's microbatches, none answered yet
    assert sum(p in fakes for p in picks) == 1 and picks.count("honest") == 7, picks
    probed = next(p for p in picks if p in fakes)
    r.release(probed, None)  # its attempt was aborted: the slot frees, nothing is held against the stage
    assert (await r.pick(1)) in fakes


async def test_a_failed_probe_closes_the_stage_to_newcomers_for_forty_times_what_it_wasted():
    r = Directory("me", {1: [("honest", 1.0), ("fake", 1e9)]})
    r.release("honest", 0.2)
    r._in_flight["honest"] = 1  # busy: 2 x 0.2 s against the newcomer's 0.2 s (the median of the measured)
    assert await r.pick(1) == "fake"  # the slot is free: the newcomer draws the next microbatch (it scores lower)
    r._probe[1] = ("fake", time.monotonic() - 0.5)  # it has held it for 0.5 s
    r.report_failure("fake")
    closed_for = r._closed[1] - time.monotonic()
    assert PROBATION_PAUSE_FACTOR * 0.5 - 1 < closed_for < PROBATION_PAUSE_FACTOR * 0.5 + 1
    r._bans.clear()  # even once its ban ends, no newcomer gets work while the probation is closed
    assert {await r.pick(1) for _ in range(5)} == {"honest"}


async def test_without_a_proven_replica_every_replica_takes_work():
    r = Directory("me", {1: [("a", 1.0), ("b", 1.0), ("c", 1.0)]})
    assert sorted([await r.pick(1) for _ in range(3)]) == ["a", "b", "c"]


def test_an_id_that_never_returned_work_is_banned_twelve_times_longer():
    r = Directory("me", {})
    r.report_failure("stranger")
    assert r._bans["stranger"].until - time.monotonic() > UNPROVEN_BAN_FACTOR * r.base_ban - 1


async def test_independent_senders_spread_their_microbatches_over_equally_fast_replicas():
    """The replicas of stage 1 each send their one microbatch of a step to stage 2 through their own router: with
    equal round trips a deterministic rule (lowest score, then lowest id) sent every one to the same replica."""
    table = {2: [("x", 1.0), ("y", 1.0)]}
    senders = [Directory(f"stage1-replica{i}", table) for i in range(2)]
    for r in senders:
        for p in ("x", "y"):
            r.release(p, 0.1)  # both proven, both measured at 0.1 s
    got = {"x": 0, "y": 0}
    for _ in range(200):  # steps
        for r in senders:
            p = await r.pick(2)
            got[p] += 1
            r.release(p, 0.1)
    assert 0.35 < got["x"] / 400 < 0.65, got


async def test_one_sender_spreads_a_steps_microbatches_exactly_and_prefers_a_clearly_faster_replica():
    r = Directory("head", {1: [("a", 1.0), ("b", 1.0)]})
    r.release("a", 0.1)
    r.release("b", 0.1)
    for _ in range(20):  # two microbatches in flight at once: one each, whatever the draw
        picks = [await r.pick(1), await r.pick(1)]
        assert sorted(picks) == ["a", "b"]
        for p in picks:
            r.release(p, 0.1)
    r._rtt["b"] = 0.1 * NEAR_TIE * 1.2  # b is clearly slower: an idle sender always picks a
    for _ in range(20):
        p = await r.pick(1)
        assert p == "a"
        r.release(p, None)


async def test_a_replica_measured_slow_once_gets_work_again_once_that_round_trip_is_forgotten():
    now = [0.0]
    r = Directory("head", {1: [("a", 1.0), ("b", 1.0)]})
    r.clock = lambda: now[0]
    r.release("a", 0.1)
    r.release("b", 3.0)  # b's one round trip carried its warm-up: 30x a's
    for _ in range(20):  # a sender with 4 in flight: a's queue never costs what b's one round trip did
        picks = [await r.pick(1) for _ in range(4)]
        assert picks == ["a"] * 4
        for p in picks:
            r.release(p, 0.1)
        now[0] += 0.05
    now[0] += 5 * RTT_FORGET_S  # five half-lives without a measurement of b: 3.0 s counts as ~0.18 s
    picks = [await r.pick(1) for _ in range(4)]
    assert "b" in picks, picks
    for p in picks:
        r.release(p, 3.0 if p == "b" else 0.1)  # measured again, b really is that slow: avoided again
    picks = [await r.pick(1) for _ in range(4)]
    assert picks == ["a"] * 4


async def test_fresh_reads_of_the_members_reach_the_dht_at_most_twice_a_second_and_a_failure_forgets_them():
    """A leading head asks for every stage's members fresh at a step's start, for the heads' shares and at the
    commit: each a DHT read on the step's critical path. Within FRESH_READ_S the last read serves; a failure
    reported meanwhile clears it (the failed peer is filtered by its ban, and the next read is a real one); a fresh
    read (a membership check) always reaches the DHT."""
    class CountingDHT:
        reads = 0

        async def stage_peers(self, run_hash: str, stage: int) -> list[StageAnnouncement]:
            self.reads += 1
            return [StageAnnouncement(p, "r", stage, [], 1.0, 0, 0, "online", "0") for p in ("a", "b")]

    now = [100.0]
    dht = CountingDHT()
    r = Router(dht=dht, run_hash="r", peer_id="me", maddrs=[], clock=lambda: now[0])
    assert [p.peer_id for p in await r.members(1)] == ["a", "b"] and dht.reads == 1
    now[0] += FRESH_READ_S * 0.8
    assert len(await r.members(1)) == 2 and dht.reads == 1  # the read of a moment ago serves
    now[0] += FRESH_READ_S * 0.4
    assert len(await r.members(1)) == 2 and dht.reads == 2  # older than FRESH_READ_S: read again
    r.report_failure("a")
    assert [p.peer_id for p in await r.members(1)] == ["b"] and dht.reads == 3  # cleared and banned
    await r.live_peers(1)
    assert dht.reads == 3  # a plain (not fresh) read keeps the cache for cache_seconds
    # a membership check must see a peer that announced a moment ago (a joiner asking for state): read now
    assert len(await r.live_peers(1, fresh=True)) == 1 and dht.reads == 4


async def test_a_peer_avoided_for_failing_is_still_heard_and_one_banned_for_bad_data_or_the_run_is_not():
    """Avoiding a peer that missed an answer is the router's business; its messages are still taken. A standby
    head that missed the leader's pings under load refused the leader's commands until the ban ended, and fell
    behind for good (test_no_coordinator). Numbers no honest peer sends, or a conviction, still close the door."""
    r = Directory("me", {0: [("leader", 1.0)], 1: [("me", 1.0), ("twin", 1.0), ("liar", 1.0)]})
    m = Membership(r, r, stage=1, n_stages=2, refresh_s=0.0)
    r.report_failure("leader")
    r.report_failure("twin")
    assert r.is_banned("leader") and [a.peer_id for a in await r.live_peers(0)] == []  # avoided for routing
    assert await m.check("leader", KIND_DRIVE) is None  # its commands are still taken
    assert await m.check("twin", KIND_REDUCE) is None  # and a replica's contribution
    r.report_failure("liar", bad_data=True)
    refusal = await m.check("liar", KIND_REDUCE)
    assert refusal is not None and "bad data" in refusal.reason
    r.ban("twin", "false work")  # convicted for the run: refused from now on
    refusal = await m.check("twin", KIND_REDUCE)
    assert refusal is not None and "for the run" in refusal.reason

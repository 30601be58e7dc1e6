"""The router's bans, on a directory given in memory (no DHT); placement: test_placement_balance.py."""
from __future__ import annotations

import time

from swarm.dht import StageAnnouncement
from swarm.replicas.router import BAD_DATA_BAN_S, Router


class Directory(Router):
    """A Router whose announcements come from a dict instead of the DHT."""

    def __init__(self, peer_id: str, table: dict[int, list[tuple[str, float]]]) -> None:
        super().__init__(dht=None, run_hash="r", peer_id=peer_id, maddrs=[])
        self.table = table

    async def announced(self, stage: int, fresh: bool = False) -> list[StageAnnouncement]:
        return [StageAnnouncement(p, "r", stage, [], t, 0, 0, "online", "0") for p, t in self.table.get(stage, [])]


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

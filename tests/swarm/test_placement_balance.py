"""Counts decide where peers serve: newcomers fill the emptiest stage even while a killed peer's
record lives on, a stage moves a peer only when it has two more than the emptiest, an empty
stage always draws one, and a peer that joined or moved stays put for its hold time. The
directory is in memory, and time is a number the test advances (no sleeps)."""
from __future__ import annotations

import asyncio
import dataclasses
import random

from protocol.spec import preset
from swarm.dht import StageAnnouncement
from swarm.replicas.placement import Rebalancer, choose_stage, move_target
from swarm.replicas.router import Router

TTL = 15.0
SPEC = preset("tiny", stages=3)


class Board:
    """What the DHT holds: each peer's last announcement, stamped with the test's DHT time, and
    dropped once it is `TTL` old (a record expires)."""

    def __init__(self) -> None:
        self.time = 1000.0
        self.records: dict[str, StageAnnouncement] = {}

    def now(self) -> float:
        return self.time

    def put(self, peer: str, stage: int, state: str = "online", throughput: float = 100.0) -> None:
        self.records[peer] = StageAnnouncement(peer, "r", stage, [], throughput, 0, 0, state, "0", timestamp=self.time)

    def beat(self, alive: set[str]) -> None:
        """The heartbeat of every live peer: its record, refreshed now."""
        for peer in alive:
            self.records[peer] = dataclasses.replace(self.records[peer], timestamp=self.time)

    def counts(self, alive: set[str]) -> list[int]:
        return [sum(1 for p in alive if self.records[p].stage == s) for s in range(SPEC.n_stages)]


class BoardRouter(Router):
    """One peer's Router, reading and writing the board instead of the DHT."""

    def __init__(self, board: Board, peer_id: str) -> None:
        super().__init__(dht=None, run_hash="r", peer_id=peer_id, maddrs=[], ttl=TTL)
        self.board = board

    async def announced(self, stage: int, fresh: bool = False, recent: bool = False) -> list[StageAnnouncement]:
        return sorted((a for a in self.board.records.values()
                       if a.stage == stage and a.timestamp > self.board.time - TTL), key=lambda a: a.peer_id)

    async def announce(self, status) -> None:
        self.board.records[self.peer_id] = dataclasses.replace(self.announcement(status), timestamp=self.board.time)


def _board(*stages: list[str]) -> Board:
    board = Board()
    for stage, peers in enumerate(stages):
        for peer in peers:
            board.put(peer, stage)
    return board


async def _movers(board: Board, held: bool = False, spec=SPEC) -> dict[str, int]:
    """Every peer whose check says "move" now -> the stage it would move to."""
    out = {}
    for peer, ann in sorted(board.records.items()):
        target = await move_target(BoardRouter(board, peer), spec, ann.stage, held, board.now)
        if target is not None:
            out[peer] = target
    return out


async def _join(board: Board, peer: str, rng: random.Random) -> int:
    stage = await choose_stage(BoardRouter(board, peer), SPEC, "auto", rng, jitter=(0.0, 0.0), now=board.now)
    board.put(peer, stage, throughput=rng.uniform(50, 150))
    return stage


async def test_newcomers_that_replace_killed_peers_keep_the_replica_counts_balanced():
    rng = random.Random(7)
    board, alive, serial = Board(), set(), 0
    for _ in range(7):  # a swarm that grows one peer at a time is balanced after every join
        serial += 1
        alive.add(f"p{serial:03d}")
        await _join(board, f"p{serial:03d}", rng)
        assert max(board.counts(alive)) - min(board.counts(alive)) <= 1, board.counts(alive)
    for _ in range(14):  # the tester's churn: every 60 s a peer is SIGKILLed and a fresh one starts
        board.beat(alive)
        victim = rng.choice(sorted(alive))
        alive.remove(victim)  # its record stays until it expires: it only stops being refreshed
        for _ in range(2):
            board.time += 5.0
            board.beat(alive)
        board.time += 1.0  # the newcomer looks 11 s after the victim's last beat: its record still lives
        assert victim in board.records and board.records[victim].timestamp > board.time - TTL
        before = board.counts(alive)
        serial += 1
        alive.add(f"p{serial:03d}")
        stage = await _join(board, f"p{serial:03d}", rng)
        assert before[stage] == min(before), f"the newcomer took stage {stage} of {before}"
        assert max(board.counts(alive)) - min(board.counts(alive)) <= 1, board.counts(alive)
        board.time += 49.0
        board.beat(alive)
        del board.records[victim]  # expired


async def test_a_record_one_heartbeat_late_counts_and_one_two_heartbeats_late_does_not():
    live = {"a", "b", "c", "d", "f"}
    board = _board(["a", "b"], ["c", "d"], ["e", "f"])
    board.time += 2 * TTL / 3 - 1  # "e" is one heartbeat late: it still counts, 2/2/2, the earliest stage
    board.beat(live)
    assert await _join(board, "z", random.Random(1)) == 0
    board = _board(["a", "b"], ["c", "d"], ["e", "f"])
    board.time += 2 * TTL / 3 + 1  # two heartbeats missed (its record lives on): "e" is dead, 2/2/1
    board.beat(live)
    assert await _join(board, "z", random.Random(1)) == 2


async def test_a_peer_killed_a_moment_ago_does_not_count_when_it_does_not_answer_a_probe():
    board = _board(["a", "b"], ["c", "d"], ["e", "f"])
    board.time += 1.0  # "e" was SIGKILLed a second after its beat: its record is as fresh as the others'
    board.beat({"a", "b", "c", "d", "f"})
    probed = []

    async def answers(peer: str) -> bool:
        probed.append(peer)
        return peer != "e"
    router = BoardRouter(board, "z")
    assert await choose_stage(router, SPEC, "auto", random.Random(1), jitter=(0.0, 0.0), now=board.now) == 0
    assert await choose_stage(router, SPEC, "auto", random.Random(1), jitter=(0.0, 0.0), now=board.now,
                              answers=answers) == 2
    assert "e" in probed and "z" not in probed  # every listed peer is probed, never the one choosing
    # and the periodic check: stage 0 has 3 against the probed 1 of stage 2, so one peer of stage 0 moves
    board.put("z", 0)
    rebalancer = Rebalancer(BoardRouter(board, "z"), SPEC, hold=0.0, now=board.now, answers=answers)
    assert await move_target(BoardRouter(board, "z"), SPEC, 0, now=board.now) is None  # 3/2/2 by records
    assert await rebalancer.target(0) == 2


async def test_ties_go_to_the_lowest_throughput_then_the_earliest_stage():
    board = Board()
    for peer, stage, tput in (("a", 0, 300.0), ("b", 1, 100.0), ("c", 2, 200.0)):
        board.put(peer, stage, throughput=tput)
    assert await _join(board, "z", random.Random(1)) == 1
    board = _board(["a"], ["b"], ["c"])
    assert await _join(board, "z", random.Random(1)) == 0


async def test_two_two_one_stays_and_three_two_one_moves_one_peer_to_the_one_stage():
    assert await _movers(_board(["a", "b"], ["c", "d"], ["e"])) == {}
    assert await _movers(_board(["a", "b"], ["c"], ["e", "f"])) == {}
    assert await _movers(_board(["a", "b", "z"], ["c", "d"], ["e"])) == {"z": 2}  # the highest id of stage 0
    assert await _movers(_board(["a", "b"], ["c", "d", "z"], ["e"])) == {"z": 2}
    assert await _movers(_board(["a", "b", "x"], ["c", "d", "y"], ["e"])) == {"x": 2}  # one stage gives, not both


async def test_an_empty_stage_draws_a_peer_even_from_a_held_one_but_never_the_last_of_a_stage():
    assert await _movers(_board(["a", "z"], ["c"], []), held=True) == {"z": 2}
    assert await _movers(_board(["a", "x"], ["c", "y"], []), held=True) == {"x": 2}
    assert await _movers(_board(["a"], ["c"], [])) == {}  # either would empty its own stage


async def test_throughput_alone_never_moves_a_peer():
    board = Board()  # stage 0 is 170x slower than stage 1, but 1/2 is as balanced as two stages of three peers get
    for peer, stage, tput in (("a", 0, 10.0), ("c", 1, 900.0), ("z", 1, 800.0)):
        board.put(peer, stage, throughput=tput)
    assert await _movers(board, spec=preset("tiny", stages=2)) == {}


async def test_a_peer_that_moved_stays_put_for_its_hold_unless_a_stage_is_empty():
    clock = [0.0]
    board = _board(["a", "b", "z"], ["c", "d"], ["e"])
    assert await _movers(board) == {"z": 2}
    clock[0] = 500.0
    board.put("z", 2)  # z moves to stage 2 at t = 500 s, and its hold starts
    rebalancer = Rebalancer(BoardRouter(board, "z"), SPEC, hold=300.0, clock=lambda: clock[0], now=board.now)
    del board.records["c"]  # churn: stage 1 loses a peer and stage 2 gains one; by counts z should move on
    board.put("y", 2)
    assert board.counts(set(board.records)) == [2, 1, 3]
    assert await _movers(board) == {"z": 1}
    for t in (500.0, 650.0, 799.0):
        clock[0] = t
        assert await rebalancer.target(2) is None, f"z moved {t - 500:.0f} s after its last move"
    clock[0] = 800.0
    assert await rebalancer.target(2) == 1
    clock[0] = 600.0
    del board.records["d"]  # stage 1 is empty: the hold gives way
    assert await rebalancer.target(2) == 1


async def test_forty_fake_ids_on_two_stages_move_no_honest_peer_once_the_leader_names_who_did_work():
    fakes = [f"a{i:02d}" for i in range(40)]  # ids below every honest one: by announcements, honest peers move
    board = _board(["h0"], ["h1"] + fakes[:20], ["h2"] + fakes[20:])
    assert await _movers(board) == {"h1": 0}  # counted by announcements: stage 1 has 21 peers, stage 0 has 1
    named = ["h0", "h1", "h2"]  # the leader's last apply: the peers whose reduce agreed on the step
    for peer in ("h1", "h2"):
        rebalancer = Rebalancer(BoardRouter(board, peer), SPEC, hold=0.0, now=board.now, workers=lambda: named)
        assert await rebalancer.target(1 if peer == "h1" else 2) is None, f"{peer} moved"


async def test_a_stage_counts_its_proven_peers_and_one_newcomer():
    board = _board(["h0"], ["h1", "n1", "n2", "n3"], ["h2"])  # stage 1: one proven replica and three newcomers
    named = ["h0", "h1", "h2"]
    assert await move_target(BoardRouter(board, "h1"), SPEC, 1, now=board.now, workers=lambda: named) is None
    board.put("h3", 1)  # a second proven replica: 2 + 1 newcomer against 1 is a move, and only a proven peer moves
    named.append("h3")
    moves = {p: await move_target(BoardRouter(board, p), SPEC, 1, now=board.now, workers=lambda: named)
             for p in ("h1", "h3", "n1", "n2", "n3")}
    assert moves == {"h1": None, "h3": 0, "n1": None, "n2": None, "n3": None}
    # with no list yet (a fresh process), every present peer counts, as before
    assert await move_target(BoardRouter(board, "n3"), SPEC, 1, now=board.now, workers=lambda: []) == 0


async def test_five_joiners_that_look_at_once_spread_over_every_stage():
    """Five peers started at the same moment read the same empty directory and all take stage 0; one
    moves per round (the highest id among the joiners there), the others look again: 2/2/1, not the
    4/1/0 of joiners that stopped looking once another was the one to move (seen in CI)."""
    for seed in range(5):
        board = Board()
        rngs = {f"p{i}": random.Random(seed * 10 + i) for i in range(5)}
        chosen = await asyncio.gather(*(choose_stage(BoardRouter(board, p), SPEC, "auto", rng, jitter=(0.0, 0.0),
                                                     now=board.now) for p, rng in rngs.items()))
        assert sorted(chosen.count(s) for s in range(SPEC.n_stages)) == [1, 2, 2], (seed, chosen)
        # chosen: none is a joiner that may move now (a chosen one named the mover kept every other in place)
        assert {a.state for a in board.records.values()} == {"syncing"}

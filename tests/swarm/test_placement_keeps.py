"""Placement never empties a stage to fill another (issue 56, item 4): a peer moves only if its stage
keeps another peer that is present and proven (`placement.can_give`), however full announcements make
the stage look: a newcomer, a fake id, a record a peer left behind when it moved on, a killed peer's
record that is still fresh. An empty stage still draws a peer, from the fullest stage that can give one.
The directory is in memory (tests/swarm/test_placement_balance.py's board)."""
from __future__ import annotations

import dataclasses
import random

from protocol.spec import preset
from swarm.dht import StageAnnouncement
from swarm.replicas.placement import Rebalancer, move_target
from swarm.replicas.router import LIVE_STATES
from tests.swarm.test_placement_balance import SPEC, Board, BoardRouter, _board


class LeftBehind(BoardRouter):
    """A board that also holds records peers left at stages they moved away from (the DHT keeps one
    record per peer and stage until it expires; a "leaving" announcement is best effort)."""

    def __init__(self, board: Board, peer_id: str, left: list[StageAnnouncement]) -> None:
        super().__init__(board, peer_id)
        self.left = left

    async def announced(self, stage: int, fresh: bool = False, recent: bool = False) -> list[StageAnnouncement]:
        return sorted([*await super().announced(stage), *(a for a in self.left if a.stage == stage)],
                      key=lambda a: a.peer_id)


async def _movers(board: Board, workers: list[str] | None, held: bool = False, router=BoardRouter,
                  spec=SPEC, **kw) -> dict[str, int]:
    """Every peer whose check says "move" now -> the stage it would move to."""
    out = {}
    for peer, ann in sorted(board.records.items()):
        target = await move_target(router(board, peer, **kw), spec, ann.stage, held, board.now,
                                   workers=lambda: workers)
        if target is not None:
            out[peer] = target
    return out


def _put(board: Board, stage: int, **states: str) -> None:
    for peer, state in states.items():
        board.put(peer, stage, state)


async def test_the_incident_stages_of_one_proven_peer_and_a_newcomer_each_give_none_to_an_empty_stage():
    # stage 0's peers left; stages 1 and 2 each have one proven replica and one peer that joined since the
    # last apply (stage 0 empty: no apply comes, so it stays unproven). By n_s, 0/2/2: stage 1 gave its only one
    named = ["g0", "g1", "h1", "h2"]
    for newcomer in ("online", "syncing", "joining"):
        board = _board([], ["h1"], ["h2"])
        _put(board, 1, n1=newcomer)
        _put(board, 2, n2=newcomer)
        for held in (False, True):
            assert await _movers(board, named, held) == {}, (newcomer, held)


async def test_a_fake_id_beside_a_stages_only_peer_does_not_draw_it_to_an_empty_stage():
    named = ["g0", "h1", "h2"]
    board = _board([], ["h1", "fake"], ["h2"])  # one id that never did work makes stage 1 look like two
    assert await _movers(board, named) == {}
    assert await _movers(board, named, held=True) == {}


async def test_with_no_list_of_workers_only_peers_that_serve_a_state_keep_a_stage():
    # a peer that just moved (or a swarm whose stage 0 is empty) has no W: it counts every record, and a
    # joining or syncing one holds no state yet (it may be downloading from the very peer that would go)
    for state in ("joining", "syncing"):
        board = _board([], ["h1"], ["h2"])
        _put(board, 1, j1=state)
        _put(board, 2, j2=state)
        assert await _movers(board, None) == {}, state
        assert await _movers(board, [], held=True) == {}, state
    board = _board([], ["h1", "k1"], ["h2"])  # a second serving peer: one may go
    assert await _movers(board, None) == {"k1": 0}


async def test_three_one_zero_moves_a_peer_of_the_three_and_a_stage_that_cannot_give_is_passed_over():
    named = ["a", "b", "c", "h1", "h2", "d", "e"]
    assert await _movers(_board([], ["a", "b", "c"], ["h2"]), named, held=True) == {"c": 0}
    assert await _movers(_board([], ["h2"], ["a", "b", "c"]), named, held=True) == {"c": 0}
    # 0/2/2 by n_s, but stage 1's two are a proven peer and a newcomer: stage 2 gives, not the first fullest
    board = _board([], ["h1", "n1"], ["d", "e"])
    assert await _movers(board, named) == {"e": 0}
    # 1/3/2 with a disputed stage 0 (it waits for a third replica): stage 1 has one proven peer and
    # newcomers, so stage 2 gives
    board = _board(["h0", "g0"], ["h1", "n1", "n2"], ["d", "e"])
    moves = {p: await move_target(BoardRouter(board, p), SPEC, a.stage, True, board.now,
                                  workers=lambda: [*named, "h0", "g0"], disputed=lambda: [0])
             for p, a in board.records.items()}
    assert {p: t for p, t in moves.items() if t is not None} == {"e": 0}


async def test_a_record_left_at_a_stage_the_peer_moved_away_from_counts_only_at_its_new_stage():
    board = _board([], ["h1"], ["b1", "h2"])
    board.time += 3.0  # b1 moved from stage 1 to stage 2 three seconds ago; its stage-1 record is still fresh
    board.beat({"h1", "b1", "h2"})
    left = [dataclasses.replace(board.records["b1"], stage=1, timestamp=board.time - 3.0)]
    named = ["g0", "h1", "b1", "h2"]
    # by records 0/2/2 and h1 the highest id of the first fullest: stage 1 emptied. It is 0/1/2: stage 2 gives
    assert await _movers(board, named, router=LeftBehind, left=left) == {"h2": 0}
    assert await _movers(board, None, router=LeftBehind, left=left) == {"h2": 0}


async def test_a_keeper_killed_a_moment_ago_holds_the_move_off_when_the_mover_probes_it():
    board = _board([], ["d1", "h1"], ["h2"])  # d1 was killed a second after its beat: its record is fresh
    named = ["g0", "d1", "h1", "h2"]
    probed = []

    async def answers(peer: str) -> bool:
        probed.append(peer)
        return peer != "d1"
    for probe, expected in ((None, 0), (answers, None)):
        rebalancer = Rebalancer(BoardRouter(board, "h1"), SPEC, hold=0.0, now=board.now, workers=lambda: named,
                                keeper_probe=probe)
        assert await rebalancer.target(1) == expected
    assert probed == ["d1"]  # only the peers that would stay are probed, and only once a move is decided
    board.put("k1", 1)  # a live keeper beside the dead one: the move goes ahead
    named.append("k1")
    rebalancer = Rebalancer(BoardRouter(board, "k1"), SPEC, hold=0.0, now=board.now, workers=lambda: named,
                            keeper_probe=answers)
    assert await rebalancer.target(1) == 0


async def test_on_random_boards_no_move_leaves_a_stage_without_a_serving_proven_peer_and_an_empty_one_draws():
    rng = random.Random(56)
    spec = preset("tiny", stages=4)
    states = ["online", "online", "paused", "syncing", "joining"]
    drawn = moved = 0
    for case in range(400):
        board, peers = Board(), [f"p{i:02d}" for i in range(rng.randint(0, 9))]
        for peer in peers:
            board.put(peer, rng.randrange(spec.n_stages), rng.choice(states))
        if peers and rng.random() < 0.5:  # a leading head at stage 0
            lead = rng.choice(peers)
            board.records[lead] = dataclasses.replace(board.records[lead], stage=0, state="online", leads=True)
        workers = None if rng.random() < 0.3 else [p for p in peers if rng.random() < 0.7] + ["gone"]
        moves = await _movers(board, workers, held=rng.random() < 0.5, spec=spec)
        assert len(moves) <= 1, (case, moves)
        serving = {s: {p for p, a in board.records.items() if a.stage == s and a.state in LIVE_STATES
                       and (workers is None or p in workers)} for s in range(spec.n_stages)}
        for peer, target in moves.items():
            assert serving[board.records[peer].stage] - {peer}, (case, peer, target)
        moved += bool(moves)
        empty = [s for s in range(spec.n_stages) if not any(a.stage == s for a in board.records.values())]
        if empty and any(len(serving[s]) >= 2 for s in serving):  # an empty stage draws a peer, held or not
            assert list(moves.values()) == [empty[0]], (case, moves, empty, serving)
            drawn += 1
    assert drawn >= 50 and moved >= drawn, (drawn, moved)  # the boards did exercise the rule

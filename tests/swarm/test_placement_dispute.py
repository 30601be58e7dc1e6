"""A disputed stage draws a third replica (issue 57, item 2): when a stage's only two replicas disagree, the
leader's abort names the stage (`Command.disputed`), nothing is applied until a third replica settles it,
and placement moves one peer of the fullest other stage there, whatever its hold, never the last of its
stage. The directory is in memory (tests/swarm/test_placement_balance.py's board)."""
from __future__ import annotations

import asyncio

import msgpack

from peer.replica.memory_swarm import TEST_COMMIT_OPTIONS, TEST_DRIVER_OPTIONS
from protocol.control import Command, decode_command, encode_command
from swarm.replicas.placement import move_target
from tests.peer.swarm_in_memory import make_swarm
from tests.peer.test_spot_checks import make_liar, spec_for
from tests.peer.test_two_replica_disputes import LIES_FROM, until
from tests.swarm.test_placement_balance import SPEC, BoardRouter, _board


async def _movers(board, disputed: list[int], held: bool = False) -> dict[str, int]:
    out = {}
    for peer, ann in sorted(board.records.items()):
        target = await move_target(BoardRouter(board, peer), SPEC, ann.stage, held, board.now,
                                   disputed=lambda: disputed)
        if target is not None:
            out[peer] = target
    return out


async def test_a_disputed_stage_of_two_draws_one_peer_of_the_fullest_other_stage_whatever_its_hold():
    # 2/2/2 is balanced, and a held peer stays put: unless stage 1 waits for a third replica
    assert await _movers(_board(["a", "b"], ["c", "d"], ["e", "z"]), []) == {}
    assert await _movers(_board(["a", "b"], ["c", "d"], ["e", "z"]), [1], held=True) == {"b": 1}  # the first fullest
    assert await _movers(_board(["a"], ["c", "d"], ["e", "z"]), [1], held=True) == {"z": 1}
    assert await _movers(_board(["a"], ["c", "d"], ["e"]), [1]) == {}  # never the last of a stage
    assert await _movers(_board(["a", "b"], ["c", "d", "x"], ["e", "z"]), [1]) == {}  # three: two of three settle


def test_an_abort_names_the_disputed_stages_and_an_older_command_means_none():
    cmd = Command("r", 3, 1, "abort", banned=[], disputed=[1, 2])
    assert decode_command(encode_command(cmd), "r").disputed == [1, 2]
    assert decode_command(encode_command(Command("r", 3, 1, "abort")), "r").disputed == []
    assert "p" not in msgpack.unpackb(encode_command(Command("r", 3, 1, "abort")))  # left out when empty


async def test_every_replica_hears_from_the_leaders_abort_which_stage_waits_for_a_third():
    swarm = await make_swarm(spec_for(2), [1, 2], driver_options=dict(TEST_DRIVER_OPTIONS, spot_check_rate=1.0),
                             commit_options=dict(TEST_COMMIT_OPTIONS, straggle_after=1.0))
    make_liar(swarm.peers["s1r0"], "x-50")
    run = asyncio.ensure_future(swarm.drive(LIES_FROM + 1))
    try:
        await until(lambda: all(p.commit.disputed_stages() == [1] for p in swarm.peers.values()), "the abort")
    finally:
        for task in [run, *getattr(swarm, "tasks", {}).values()]:
            task.cancel()
        await swarm.stop()

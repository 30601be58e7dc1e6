"""A peer takes only a stage that fits its memory: placement chooses among the stages that fit,
the rebalancer never moves it to one that does not, and when none fits (or the `--stage N` asked
for does not) it refuses with one sentence naming the need and the smallest card that holds it.
A peer with a bad `--max-memory` is refused before any network is started (tests/e2e/test_memory_refusal.py
starts a coordinator and a peer whose memory holds no stage)."""
from __future__ import annotations

import random

import pytest
from test_placement_balance import SPEC, BoardRouter, _board

from peer.runner.memory_estimate import GIB, estimate_stage, parse_size, smallest_card
from protocol.spec import preset
from swarm.replicas.memory_fit import fitting_stages, memory_budget
from swarm.replicas.placement import choose_stage, move_target


def _one_sentence(text: str) -> None:
    assert text.endswith(".") and text.count(". ") == 0 and "\n" not in text, text


def test_a_peer_too_small_for_every_stage_refuses_naming_the_need_and_the_card() -> None:
    spec = preset("paper8b", dtype="bf16")
    with pytest.raises(ValueError) as e:
        fitting_stages(spec, parse_size("12GB"), "cuda")
    text = str(e.value)
    _one_sentence(text)
    least = min((estimate_stage(spec, s, replicated=True) for s in range(spec.n_stages)), key=lambda m: m.peak)
    assert text.startswith("no stage of paper8b fits this peer's 12.0 GiB")  # 12GB is a 12 GB card's 12 GiB
    assert f"stage {least.stage}, needs about {least.peak / GIB:.1f} GiB" in text
    assert f"a {smallest_card(least.peak)} GB card or larger" in text and "--activation-checkpointing" in text


def test_a_requested_stage_that_does_not_fit_is_refused_and_checkpointing_makes_it_fit() -> None:
    spec = preset("paper8b", dtype="bf16")
    with pytest.raises(ValueError) as e:
        fitting_stages(spec, parse_size("24GiB"), "cuda", requested=1)
    text = str(e.value)
    _one_sentence(text)
    assert text.startswith("stage 1 of paper8b needs about") and "this peer has 24.0 GiB" in text
    assert "--stage auto (stages that fit: 7)" in text  # the last stage is smaller: no optimizer for an encoder
    assert fitting_stages(spec, parse_size("24GiB"), "cuda", checkpointing=True, requested=1) == frozenset(range(8))


def test_no_budget_means_every_stage_and_a_cpu_peer_has_none_unless_told() -> None:
    assert fitting_stages(SPEC, None) == frozenset(range(SPEC.n_stages))
    assert memory_budget(None, "cpu") is None and memory_budget("8GiB", "cpu") == 8 * GIB


async def test_placement_chooses_the_emptiest_stage_that_fits_and_never_moves_a_peer_out_of_it() -> None:
    board = _board(["a", "b"], ["c", "d"], [])  # stage 2 is empty, but this peer fits only stages 0 and 1
    stage = await choose_stage(BoardRouter(board, "z"), SPEC, "auto", random.Random(1), jitter=(0.0, 0.0),
                               now=board.now, allowed=frozenset({0, 1}))
    assert stage in (0, 1)
    free = await choose_stage(BoardRouter(board, "z"), SPEC, "auto", random.Random(1), jitter=(0.0, 0.0),
                              now=board.now)
    assert free == 2
    board = _board(["a", "b", "z"], ["c", "d"], ["e"])  # z would move to stage 2 (see test_placement_balance)
    assert await move_target(BoardRouter(board, "z"), SPEC, 0, now=board.now) == 2
    assert await move_target(BoardRouter(board, "z"), SPEC, 0, now=board.now, allowed=frozenset({0, 1})) is None


async def test_swarm_peer_refuses_a_bad_max_memory_before_joining() -> None:
    from swarm.node import JoinError, PeerOptions, run_peer
    opts = PeerOptions(initial_peers=["/ip4/127.0.0.1/tcp/9/p2p/QmNotThere"], max_memory="8 bananas")
    with pytest.raises(JoinError) as e:  # before the DHT starts: no daemon, no process
        await run_peer(opts)
    assert str(e.value) == "--max-memory must be a size such as 8GB, 8GiB or 512MiB, not '8 bananas'."

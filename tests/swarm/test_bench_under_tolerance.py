"""`swarm bench share-tolerance --liar-steps` (swarm/bench/replicas/under_tolerance.py) at a few steps of `tiny` on
the CPU: the mechanics of its liars, not what they do over a run (that is the benchmark's: docs/security.md, "A liar
just under the tolerance, measured"). A lie of 0 is the honest run bit for bit; every lie is scored by the spot
check's own measure at exactly 0.99 x the tolerance, so no check would catch it, and it reaches the weights; Adam's
first step cancels a sole replica's scale lie but not a bias; and the CLI writes its JSON and PNG."""
from __future__ import annotations

import json

import pytest
import torch

from peer.checks.share_check import TOLERANCE
from peer.replica.memory_swarm import batches
from protocol.spec import preset
from swarm.bench.replicas.under_tolerance import (
    MARGIN,
    SHAPES,
    ReplicatedPipeline,
    Variant,
    flat_weights,
)
from swarm.cli import main


def _train(variant: Variant, steps: int, replicas: int = 2) -> ReplicatedPipeline:
    spec = preset("tiny", total_steps=100)
    pipe, src = ReplicatedPipeline(spec, replicas, variant, (1, 2)), batches(spec)
    for step in range(steps):
        pipe.train_step(step, src)
    return pipe


def _distance(a: ReplicatedPipeline, b: ReplicatedPipeline) -> list[float]:
    """||W_a - W_b|| / ||W_b|| per stage."""
    return [float((x.double() - y.double()).norm() / y.double().norm()) for x, y in zip(flat_weights(a),
                                                                                        flat_weights(b))]


def test_a_lie_of_zero_is_the_honest_run_and_every_lie_sits_at_its_margin_under_the_tolerance():
    honest = _train(Variant("honest"), 2)
    zero = _train(Variant("zero", "fixed", 0.0), 2)  # the liar's code path, lying by nothing
    assert all(torch.equal(a, b) for a, b in zip(flat_weights(zero), flat_weights(honest)))
    assert zero.scores == [0.0] * 4  # 2 steps x 2 liar stages
    for tol in (TOLERANCE[torch.float32], TOLERANCE[torch.bfloat16]):
        for shape in SHAPES:
            liar = _train(Variant(shape, shape, MARGIN * tol), 2)
            # what a spot check computes, ||lie - h|| / ||h||: 0.99 x tol up to fp32 rounding of h + eps ||h|| d
            assert len(liar.scores) == 4 and all(abs(s / (MARGIN * tol) - 1) < 2e-3 for s in liar.scores), \
                (shape, tol, liar.scores)
            assert max(liar.scores) <= tol  # ShareCheck accepts off <= tolerance: never caught
            moved = _distance(liar, honest)
            assert moved[1] > 0 and moved[2] > 0, (shape, tol, moved)  # the lie reached the liar stages' weights


def test_adams_first_step_cancels_a_sole_replicas_scale_lie_but_not_a_bias():
    # with one replica the lie is the stage's whole gradient g. Adam's first update is -lr g / (|g| + eps) per
    # entry (the constrained weights: g over its column's rms), and clipping rescales the whole: both blind to
    # g's scale, so (1 + e) g moves the weights as g does, up to the eps term; a bias e ||g|| u changes g's
    # direction and moves them
    tol = TOLERANCE[torch.bfloat16]
    honest = _train(Variant("honest"), 1, replicas=1)
    scaled = _distance(_train(Variant("scale", "scale", MARGIN * tol), 1, replicas=1), honest)
    biased = _distance(_train(Variant("fixed", "fixed", MARGIN * tol), 1, replicas=1), honest)
    assert scaled[0] == 0.0  # the head tells no lie, and its gradient comes before any liar's step
    assert max(scaled[1:]) < 1e-5, scaled  # measured 4.9e-7 (the eps term); the bias: 2.1e-3 and 2.3e-3
    assert min(biased[1:]) > 1000 * max(scaled[1:]), (scaled, biased)


@pytest.mark.parametrize("replicas", [0, 3])
def test_each_replica_needs_a_microbatch(replicas):
    with pytest.raises(ValueError, match="microbatches a step"):
        ReplicatedPipeline(preset("tiny"), replicas, Variant("honest"), (1, 2))


def test_the_cli_writes_the_runs_json_and_png(tmp_path):
    from pydoc_data.topics import topics  # the embedded corpus, as a file: --data takes a path
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(topics.values()))
    out = tmp_path / "out"
    assert main(["bench", "share-tolerance", "--liar-steps", "2", "--eval-every", "1", "--liars", "bf16:drag",
                 "--noise", "data", "--data", str(corpus), "--out", str(out)]) == 0
    written = json.loads((out / "under_tolerance.json").read_text())
    assert (out / "under_tolerance.png").stat().st_size > 10_000
    assert written["replicas"] == 2 and written["liar_stages"] == [1, 2] and written["steps"] == 2
    names = [r["variant"]["name"] for r in written["runs"]]
    assert names == ["honest", "honest, data seed +1", "bf16 tol: drag"]
    for run in written["runs"]:
        assert [p["step"] for p in run["points"]] == [0, 1, 2]
    honest, noise, liar = written["runs"]
    assert all(d == 0 for p in honest["points"] for d in p["distance"])
    assert liar["points"][0]["distance"] == [0, 0, 0]  # the same initial weights
    assert all(d > 0 for d in liar["points"][-1]["distance"][1:])
    assert liar["lie_scores"]["n"] == 4 and liar["lie_scores"]["max"] <= TOLERANCE[torch.bfloat16]
    summary = written["summary"]
    delta = noise["points"][-1]["held_out"] - honest["points"][-1]["held_out"]
    assert summary["noise_floor"]["delta"] == pytest.approx(abs(delta))
    row = summary["runs"]["bf16 tol: drag"]
    assert row["exceeds_floor"] == (abs(row["delta"]) > summary["noise_floor"]["delta"]
                                    or abs(row["delta_tail"]) > summary["noise_floor"]["delta_tail"])

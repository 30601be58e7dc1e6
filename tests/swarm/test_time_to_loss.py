"""Time to loss from measured tokens/s and loss-per-token curves (no training here: the inputs are
what the two benchmarks write)."""
from __future__ import annotations

import pytest

from swarm.bench.record.time_to_loss import TimeToLossError, link_throughput, seconds_to, time_to_loss

THROUGHPUT = {"preset": "small", "runs": [
    {"codec": "dense", "bandwidth": "unlimited", "shaping": "none", "tokens_per_second": 60000.0},
    {"codec": "dense", "bandwidth": "80mbit", "shaping": "builtin", "tokens_per_second": 5000.0},
    {"codec": "subspace", "bandwidth": "80mbit", "shaping": "builtin", "tokens_per_second": 50000.0},
    {"codec": "subspace", "bandwidth": "8mbit", "shaping": "builtin", "tokens_per_second": 40000.0},
    {"codec": "subspace", "bandwidth": "80mbit", "shaping": "kernel", "tokens_per_second": 48000.0},
]}
CONVERGENCE = {"preset": "small", "curves": {
    "dense": {"spec": {"codec": "dense"}, "val": [[1e6, 3.0], [2e6, 2.0], [3e6, 1.5]]},
    "fixed U": {"spec": {"codec": "subspace"}, "val": [[1e6, 3.2], [2e6, 2.4], [3e6, 1.8]]},
}}


def test_loss_against_seconds_per_codec():
    r = time_to_loss(CONVERGENCE, THROUGHPUT, "80mbit")
    assert r["curves"]["dense"]["val"] == [[200.0, 3.0], [400.0, 2.0], [600.0, 1.5]]
    assert r["curves"]["fixed U"]["val"] == [[20.0, 3.2], [40.0, 2.4], [60.0, 1.8]]
    assert r["target_loss"] == 1.8  # the worst final loss: every variant gets there
    assert r["curves"]["fixed U"]["seconds_to_target"] == 60.0
    assert r["curves"]["dense"]["seconds_to_target"] == pytest.approx(400 + 200 * 0.2 / 0.5)
    assert r["notes"] == []
    assert time_to_loss(CONVERGENCE, THROUGHPUT, "80mbit", shaping="kernel")["curves"].keys() == {"fixed U"}


def test_link_choice_and_what_is_missing():
    assert link_throughput(THROUGHPUT) == {"dense": 5000.0, "subspace": 50000.0}  # first limited link
    assert link_throughput(THROUGHPUT, "8mbit") == {"subspace": 40000.0}
    with pytest.raises(TimeToLossError, match="no builtin run at 20mbit; they have 80mbit \\(builtin\\)"):
        link_throughput(THROUGHPUT, "20mbit")
    r = time_to_loss(CONVERGENCE, THROUGHPUT, "8mbit")
    assert r["notes"] == ["no throughput for dense"]
    assert time_to_loss(CONVERGENCE, {**THROUGHPUT, "preset": "large"})["notes"] == [
        "throughput measured on preset large, curves on small"]


def test_seconds_to_interpolates_and_says_never():
    assert seconds_to([[1.0, 4.0], [3.0, 2.0]], 3.0) == 2.0
    assert seconds_to([[1.0, 4.0], [3.0, 2.0]], 5.0) == 1.0
    assert seconds_to([[1.0, 4.0], [3.0, 2.0]], 1.0) is None

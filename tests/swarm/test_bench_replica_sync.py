"""`swarm bench replica-sync` at smoke size, and the byte counts it reports for big presets
(computed without allocating the tensors) against the real encoding."""
from __future__ import annotations

import json
import math

import pytest
import torch

from protocol.control import Contribution, encode_contribution
from protocol.spec import preset
from swarm.bench.replicas.replica_sync import run_replica_sync_bench
from swarm.bench.replicas.sync_bytes import FRAMING, encoded_size, stage_layout, sync_bytes


def test_encoded_sizes_equal_the_real_encoding_of_big_and_small_messages():
    spec = preset("tiny", stages=2)
    for n_exact, n_factors in ((10, None), (70_000, 300_000), (5, 200_000)):
        factors = (n_factors, torch.bfloat16) if n_factors else None
        stat = torch.zeros(spec.d_model, spec.rank, dtype=torch.float64)
        want = Contribution(spec.run_hash, 0, 0, 1, [0, 1], torch.zeros(n_exact), stat, 0,
                            torch.zeros(n_factors, dtype=torch.bfloat16) if n_factors else None)
        assert encoded_size(spec, 1, [0, 1], (n_exact, torch.float32), factors, True) == len(encode_contribution(want))


def test_the_byte_rows_follow_the_layouts():
    spec = preset("small", codec="subspace")
    rows = sync_bytes(spec, rank=4)
    layout, n_params = stage_layout(spec, 1)
    by = {(r["stage"], r["mode"]): r["bytes_per_step"] for r in rows}
    assert n_params * 4 < by[(1, "exact, full")] < n_params * 4 + 200_000  # fp32 gradients + a statistic + framing
    assert layout.numel * 4 < by[(1, "exact")] < by[(1, "exact, full")]
    assert by[(2, "exact")] == by[(2, "exact, full")]  # the last stage is free: nothing is constrained
    for s in range(spec.n_stages):
        assert 20 * by[(s, "powersgd")] < by[(s, "exact")]
    assert by[(1, "powersgd")] > 2 * FRAMING


@pytest.mark.e2e  # a whole benchmark (in-memory swarms, loss runs and a plot)
def test_replica_sync_bench_smoke(tmp_path):
    result = run_replica_sync_bench(str(tmp_path), ranks=(2, 4), seeds=2, smoke=True)
    written = json.loads((tmp_path / "replica_sync.json").read_text())
    assert (tmp_path / "replica_sync.png").stat().st_size > 10_000
    assert written["speed"] == result["speed"]
    assert [(r["replicas"], r["mode"]) for r in written["speed"]] == \
        [(1, "(alone)"), (2, "exact"), (2, "powersgd r=2"), (2, "powersgd r=4")]
    assert written["speed"][0]["ratio_to_alone"] == 1.0 and written["speed"][0]["max_sync_bytes_per_step"] == 0
    exact, r2, r4 = (written["speed"][i]["max_sync_bytes_per_step"] for i in (1, 2, 3))
    assert exact > 5 * r4 > 5 * r2 > 0  # tiny's matrices are small: rank 4 gains less than on small or large
    assert all(r["tokens_per_second"] > 0 and r["commit_seconds"] > 0 for r in written["speed"])
    assert [(r["mode"], r["seed"]) for r in written["loss"]] == \
        [(m, s) for s in (0, 1) for m in ("exact", "powersgd r=2", "powersgd r=4")]
    assert all(math.isfinite(r["held_out_loss"]) and len(r["train"]) == 4 for r in written["loss"])
    assert len({r["tokens"] for r in written["loss"]}) == 1  # equal tokens
    summary = {r["mode"]: r for r in written["loss_summary"]}
    assert summary["exact"]["mean_vs_exact"] == 0 and summary["powersgd r=4"]["runs"] == 2
    for_r4 = [r["held_out_loss"] / e["held_out_loss"] - 1 for r, e in zip(written["loss"][2::3], written["loss"][::3])]
    assert summary["powersgd r=4"]["mean_vs_exact"] == sum(for_r4) / 2  # compared seed by seed
    summary = {(r["preset"], r["mode"]): r for r in written["bytes_summary"]}
    assert summary[("tiny", "powersgd r=2")]["bytes_per_step"] < summary[("tiny", "powersgd r=4")]["bytes_per_step"] \
        < summary[("tiny", "exact")]["bytes_per_step"]

"""`swarm bench replica-sync` at smoke size, and the byte counts it reports for big presets
(computed without allocating the tensors) against the real encoding."""
from __future__ import annotations

import json
import math

import torch

from protocol.control import Contribution, encode_contribution
from protocol.spec import preset
from swarm.bench.replica_sync import run_replica_sync_bench
from swarm.bench.sync_bytes import FRAMING, encoded_size, stage_layout, sync_bytes


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


def test_replica_sync_bench_smoke(tmp_path):
    result = run_replica_sync_bench(str(tmp_path), smoke=True)
    written = json.loads((tmp_path / "replica_sync.json").read_text())
    assert (tmp_path / "replica_sync.png").stat().st_size > 10_000
    assert written["speed"] == result["speed"]
    assert [(r["replicas"], r["mode"]) for r in written["speed"]] == [(1, "(alone)"), (2, "exact"), (2, "powersgd")]
    assert written["speed"][0]["ratio_to_alone"] == 1.0 and written["speed"][0]["max_sync_bytes_per_step"] == 0
    exact, power = written["speed"][1]["max_sync_bytes_per_step"], written["speed"][2]["max_sync_bytes_per_step"]
    assert exact > 5 * power > 0  # tiny's matrices are small: rank 4 gains less than on small or large
    assert all(r["tokens_per_second"] > 0 and r["commit_seconds"] > 0 for r in written["speed"])
    assert [r["mode"] for r in written["loss"]] == ["exact", "powersgd"]
    assert all(math.isfinite(r["held_out_loss"]) and len(r["train"]) == 4 for r in written["loss"])
    assert written["loss"][0]["tokens"] == written["loss"][1]["tokens"]  # equal tokens
    summary = {(r["preset"], r["mode"]): r for r in written["bytes_summary"]}
    assert summary[("tiny", "powersgd")]["bytes_per_step"] < summary[("tiny", "exact")]["bytes_per_step"]

"""`swarm bench throughput` and `swarm bench convergence` at smoke size: they run end to end and
write JSON and a PNG whose figures are consistent (benchmarks are not tests: no speed is asserted)."""
from __future__ import annotations

import json

from swarm.bench.convergence import run_convergence_bench
from swarm.bench.throughput import CODECS, run_throughput_bench


def test_convergence_bench_smoke(tmp_path):
    result = run_convergence_bench(str(tmp_path), data=None, smoke=True)
    written = json.loads((tmp_path / "convergence.json").read_text())
    assert (tmp_path / "convergence.png").stat().st_size > 10_000
    assert set(written["curves"]) == {"fixed U", "U re-fit every 10", "dense"}
    refit = written["curves"]["U re-fit every 10"]
    assert [s["step"] for s in refit["switches"]] == [15, 25]  # re-fits at 10 and 20, 5 steps later
    assert all(0 < max(s["truncated"]) < 0.2 for s in refit["switches"])
    assert written["curves"]["fixed U"]["switches"] == []
    for curve in written["curves"].values():
        assert len(curve["train"]) == 30 and curve["val"][-1][1] < curve["val"][0][1]
    assert result["summary"]["fixed U"]["vs_fixed"] == 0


def test_throughput_bench_smoke(tmp_path):
    result = run_throughput_bench(str(tmp_path), smoke=True)
    written = json.loads((tmp_path / "throughput.json").read_text())
    assert (tmp_path / "throughput.png").stat().st_size > 10_000
    assert {(r["codec"], r["bandwidth"]) for r in written["runs"]} == \
        {(c, b) for c in CODECS[:2] for b in ("unlimited", "80mbit")}
    by = {(r["codec"], r["bandwidth"]): r for r in written["runs"]}
    dense, sub = by[("dense", "80mbit")], by[("subspace", "80mbit")]
    assert dense["forward_bytes_per_token"] > 5 * sub["forward_bytes_per_token"]
    assert all(r["tokens_per_second"] > 0 for r in written["runs"])
    assert result["ratios"]["subspace_over_dense_limited"] == \
        sub["tokens_per_second"] / dense["tokens_per_second"]

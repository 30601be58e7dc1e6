"""`swarm bench verify` at smoke size: every rate runs, the checks it counts happen at the rate
they claim, no honest replica is banned, and the JSON and PNG are written."""
from __future__ import annotations

import json

from swarm.bench.replicas.verify import RATES, run_verify_bench


def test_verify_bench_smoke(tmp_path):
    result = run_verify_bench(str(tmp_path), smoke=True)
    written = json.loads((tmp_path / "verify.json").read_text())
    assert written["summary"] == result["summary"]
    assert (tmp_path / "verify.png").stat().st_size > 10_000
    rows = {r["rate"]: r for r in written["summary"]}
    assert set(rows) == set(RATES)
    assert rows[0.0]["checks_per_step"] == 0 and rows[0.0]["input_bytes_per_step"] == 0
    # rate 1: every share that did work (2 replicas of one stage: one or both, as the router spread the step's
    # 2 microbatches) is recomputed by the other replica, every step
    assert 1 <= rows[1.0]["checkable_per_step"] <= 2
    assert rows[1.0]["checks_per_step"] == rows[1.0]["checkable_per_step"] and rows[1.0]["input_bytes_per_step"] > 0
    assert all(r["banned"] == [] for r in written["summary"]), "an honest replica was banned"
    assert all(r["attempts"] <= r["steps"] + 1 for r in written["runs"]), "a check made a step fail"
    assert all(0 < r["ratio_to_unchecked"] for r in written["summary"])

"""`swarm bench share-tolerance` at smoke size on the CPU (fp32): the honest computations of a
share agree within fp32's tolerance, the lies score what their arithmetic says (-50x: 51; random
numbers of the honest norm: ~sqrt 2), and a bf16 run's checks use bf16's tolerance."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import torch

from peer.checks.share_check import TOLERANCE, ShareCheck
from protocol.spec import preset
from swarm.bench.replicas.share_tolerance import HONEST, run_share_tolerance_bench


def test_honest_shares_agree_and_lies_do_not(tmp_path):
    result = run_share_tolerance_bench(str(tmp_path), smoke=True)
    written = json.loads((tmp_path / "share_tolerance.json").read_text())
    assert written["honest_max"] == result["honest_max"]
    assert (tmp_path / "share_tolerance.png").stat().st_size > 10_000
    [run] = written["runs"]
    assert run["dtype"] == "fp32" and written["tolerance"] == TOLERANCE[torch.float32]
    # tiny: 2 microbatches a step dealt to 2 shares, for each of the 2 stages after the head
    assert len(run["rows"]) == 4 and all(r["norm"] > 0 for r in run["rows"])
    for row in run["rows"]:
        for k in ("again", "sent", "cpu", "cpu-fp32"):  # the same fp32 kernels on this CPU
            assert row[k] <= 1e-6, (k, row)
        assert row["other kernels"] <= 1e-5, row  # the math attention kernel: fp32 rounding apart
        assert all(row[k] <= written["tolerance"] for k in HONEST)
        assert abs(row["x -50"] - 51) < 1e-3, row  # ||r + 50 r|| / ||r|| with sent = r
        assert abs(row["random"] - math.sqrt(2)) < 0.05, row  # orthogonal to r in ~1e5 dimensions, same norm
        assert row["another share"] > 100 * written["tolerance"], row
    assert written["smallest_lie"] == min(r[k] for r in run["rows"] for k in ("x -50", "another share", "random"))


def test_a_bf16_run_checks_with_the_bf16_tolerance():
    # a bf16 run keeps fp32 weights (runner.dtype is fp32); its shares carry bf16 rounding
    daemon = SimpleNamespace(spec=preset("tiny", dtype="bf16"), runner=SimpleNamespace(dtype=torch.float32))
    assert ShareCheck(daemon).tolerance == TOLERANCE[torch.bfloat16] > TOLERANCE[torch.float32]

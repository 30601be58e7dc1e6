"""`swarm bench throughput`, `convergence`, `mfu` and `churn` at smoke size: they run end to end and
write JSON and a PNG whose figures are consistent (benchmarks are not tests: no speed is asserted)."""
from __future__ import annotations

import json
import subprocess

import pytest

from protocol.model import build_stage
from protocol.spec import preset
from swarm.bench.churn.bench import run_churn_bench
from swarm.bench.hardware.mfu import matmul_weights, run_mfu_bench
from swarm.bench.record.convergence import run_convergence_bench
from swarm.bench.record.throughput import CODECS, run_throughput_bench
from tests.netlab import missing_requirements


@pytest.mark.e2e  # a whole benchmark (three training runs and a plot)
def test_convergence_bench_smoke(tmp_path, monkeypatch):
    # one torch thread, as every test has (tests/conftest.py): the bench takes all cores, and on a busy
    # 2-core box a second thread mostly spins waiting for the first
    monkeypatch.setattr("swarm.bench.record.convergence.os.cpu_count", lambda: 1)
    # the throughput bench's figures at 80mbit (as its JSON has them), for the time-to-loss plot
    throughput = {"preset": "tiny", "device": "cpu", "runs": [
        {"codec": c, "bandwidth": b, "shaping": s, "tokens_per_second": t}
        for c, b, s, t in [("dense", "unlimited", "none", 9000.0), ("dense", "80mbit", "builtin", 500.0),
                           ("subspace", "80mbit", "builtin", 8000.0), ("bottleneck", "80mbit", "builtin", 7000.0),
                           ("dense", "80mbit", "kernel", 450.0)]]}
    (tmp_path / "throughput.json").write_text(json.dumps(throughput))
    result = run_convergence_bench(str(tmp_path), data=None, smoke=True)
    written = json.loads((tmp_path / "convergence.json").read_text())
    assert (tmp_path / "convergence.png").stat().st_size > 10_000
    assert set(written["curves"]) == {"fixed U", "U re-fit every 6", "dense", "bottleneck"}
    refit = written["curves"]["U re-fit every 6"]
    assert [s["step"] for s in refit["switches"]] == [9, 15]  # re-fits at 6 and 12, 3 steps later
    assert all(0 < max(s["truncated"]) < 0.2 for s in refit["switches"])
    assert written["curves"]["fixed U"]["switches"] == []
    for curve in written["curves"].values():
        assert len(curve["train"]) == 20 and curve["val"][-1][1] < curve["val"][0][1]
    assert result["summary"]["fixed U"]["vs_fixed"] == 0
    # time to loss: each variant's held-out curve over its codec's tokens/s at 80mbit (built-in shaping)
    ttl = json.loads((tmp_path / "time_to_loss.json").read_text())
    assert (tmp_path / "time_to_loss.png").stat().st_size > 10_000
    assert ttl["bandwidth"] == "80mbit" and ttl["tokens_per_second"] == {"dense": 500.0, "subspace": 8000.0,
                                                                          "bottleneck": 7000.0}
    for name, curve in written["curves"].items():
        tps = ttl["tokens_per_second"][curve["spec"]["codec"]]
        assert ttl["curves"][name]["val"] == [[tokens / tps, loss] for tokens, loss in curve["val"]]
    assert ttl["target_loss"] == max(c["val"][-1][1] for c in written["curves"].values())
    assert all(c["seconds_to_target"] is not None for c in ttl["curves"].values())


@pytest.mark.e2e  # the bench runs local swarms of real processes
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


@pytest.mark.e2e  # a whole benchmark
def test_mfu_bench_smoke(tmp_path):
    result = run_mfu_bench(str(tmp_path), device="cpu", smoke=True)
    written = json.loads((tmp_path / "mfu.json").read_text())
    assert (tmp_path / "mfu.png").stat().st_size > 10_000
    spec = preset("tiny", codec="dense", dtype="bf16")
    d, f, L = spec.d_model, spec.d_ff, spec.n_layers
    assert written["train"]["matmul_weights"] == L * (4 * d * d + 3 * d * f) + d * spec.vocab
    assert written["flops_per_token"] == 6 * written["train"]["matmul_weights"] + 12 * L * spec.seq_len * d
    assert len(written["train"]["step_seconds"]) == 2 and all(s > 0 for s in written["train"]["step_seconds"])
    assert written["matmul"]["flops_per_second"] == 2 * 256**3 / written["matmul"]["seconds"]
    assert result["mfu"] == pytest.approx(written["train"]["tokens_per_second"] * written["flops_per_token"]
                                          / written["matmul"]["flops_per_second"])


def test_mfu_counts_the_factored_subspace_maps_at_rank_k():
    """In a bf16 run a constrained map costs k (d_in + d) multiplies per token, not d d_in."""
    spec = preset("tiny", codec="subspace", dtype="bf16")
    d, f, k, V = spec.d_model, spec.d_ff, spec.rank, spec.vocab
    stages = [build_stage(spec, s) for s in range(spec.n_stages)]
    free = spec.stage_layers[-1]  # the last stage is unconstrained
    constrained = spec.n_layers - free
    want = spec.n_layers * (3 * d * d + 2 * d * f) + free * (d * d + f * d) \
        + constrained * (k * (d + d) + k * (f + d)) + d * V
    assert matmul_weights(stages) == want
    fp32 = [build_stage(spec.replace(dtype="fp32"), s) for s in range(spec.n_stages)]
    assert matmul_weights(fp32) == spec.n_layers * (4 * d * d + 3 * d * f) + d * V


@pytest.mark.e2e  # peers in network namespaces, one of them killed
@pytest.mark.skipif(bool(missing_requirements(nat=False)), reason=str(missing_requirements(nat=False)))
def test_churn_bench_smoke(tmp_path):
    """4 hosts, 2 stages x 2 replicas, 5 s calm, then the leading head killed and a fresh peer started."""
    run_churn_bench(str(tmp_path), smoke=True)
    written = json.loads((tmp_path / "churn.json").read_text())
    try:
        _check_churn_smoke(tmp_path, written)
    except Exception:  # CI keeps no files: the peers' last log lines say what the swarm did meanwhile
        for log in sorted((tmp_path / "churn-run").glob("*.log")):
            print(f"--- {log.name}, last lines:", *log.read_text(errors="replace").splitlines()[-25:], sep="\n")
        raise


def _check_churn_smoke(tmp_path, written: dict) -> None:
    assert (tmp_path / "churn.png").stat().st_size > 10_000
    s, records = written["summary"], written["records"]
    [kill] = s["kills"]
    assert kill["targeted"] and kill["leader"] and kill["stage"] == 0
    peers = {p["name"]: p for p in written["peers"]}
    assert len(peers) == 5 and kill["newcomer"] not in {"h0", "h1", "h2", "h3"}
    assert peers[kill["victim"]]["killed_at_s"] == pytest.approx(kill["at_s"], abs=0.06)
    assert kill["gone_s"] is not None and kill["gone_s"] < 20  # its DHT child and p2pd went by themselves
    assert any(r[0] < kill["at_s"] and r[3] == kill["victim"] for r in records)  # it led before the kill
    # the figures are those of the records: failover = the next record of another head, if any came
    after = [r for r in records if r[0] > kill["at_s"]]
    other = next((r for r in after if r[3] != kill["victim"]), None)
    if other is None:
        assert kill["failover_s"] is None and s["failover_s"] == []
    else:
        assert kill["failover_s"] == pytest.approx(other[0] - kill["at_s"], abs=0.02)
    steps = sorted(r[1] for r in records if r[5])
    assert steps, f"no step stood: all {len(records)} records were driven again"
    assert s["steps"] == steps[-1] and s["records"] == len(records)
    assert s["lost_steps"] == sorted(set(range(1, steps[-1] + 1)) - set(steps))
    assert sorted(s["doubled_steps"] + s["repeated_steps"]) == sorted({n for n in steps if steps.count(n) > 1})
    assert s["goodput"]["calm_steps_per_min"] > 0 and s["goodput"]["churn_steps_per_min"] is not None
    # replicas of a stage compared through their checkpoints (every 3 steps), and equal
    assert s["replica_agreement"]["pairs_compared"] >= 1 and s["replica_agreement"]["bit_identical"]
    # nothing left on any host 15 s after the stop, and every namespace gone
    assert written["left_behind"] == {}
    assert written["namespace_tag"] not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                           text=True).stdout


def test_throughput_compares_sends_in_order_with_shared_sends_side_by_side(tmp_path):
    """A variant beside its "/shared" twin gets a fifo-over-shared ratio per limited link; a send order
    the peers do not know is refused before any swarm starts."""
    from swarm.bench.record.throughput import throughput_ratios
    rows = [{"variant": v, "codec": "dense", "bandwidth": b, "shaping": s, "tokens_per_second": t}
            for v, b, s, t in [("dense", "unlimited", "none", 1000.0), ("dense", "8mbit", "builtin", 400.0),
                               ("dense/shared", "unlimited", "none", 990.0),
                               ("dense/shared", "8mbit", "builtin", 250.0)]]
    ratios = throughput_ratios(rows, ("dense", "dense/shared"), ["8mbit"])
    assert ratios["dense_8mbit_fifo_over_shared"] == pytest.approx(1.6)
    with pytest.raises(ValueError, match="--send-order takes fifo or shared"):
        run_throughput_bench(str(tmp_path), send_orders="fifo,lifo")
    assert not list(tmp_path.iterdir())

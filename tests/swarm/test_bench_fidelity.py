"""`swarm bench fidelity` at smoke size: every job of the plan runs in worker processes and comes
back as one JSON line, the summary's comparisons are the losses' ratios, the figure is drawn;
and a budget too small for the plan still ends on time, with every job accounted for. With
`dense_runs` N every dense job runs N times and the comparisons take the mean of its ok runs."""
from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from protocol.reference import ReferenceModel
from protocol.spec import preset
from swarm.bench.fidelity import bench as fidelity
from swarm.bench.fidelity.bench import run_fidelity_bench
from swarm.bench.fidelity.plan import ALL_GROUPS, jobs_for, plan_shape, with_dense_repeats
from swarm.bench.fidelity.queue import estimated_seconds, run_queue
from swarm.bench.fidelity.report import markdown_table, summarize
from swarm.bench.fidelity.train import Job, JobResult, full_width_boundaries
from swarm.cli import build_parser


@pytest.mark.e2e
def test_fidelity_bench_smoke(tmp_path):
    result = run_fidelity_bench(str(tmp_path), smoke=True, parallel=2, budget_s=300)
    jobs = jobs_for("smoke")
    lines = [json.loads(x) for x in (tmp_path / "fidelity.jsonl").read_text().splitlines()]
    assert sorted((r["group"], r["name"]) for r in lines) == sorted((j.group, j.name) for j in jobs)
    assert all(not r["error"] and not r["truncated"] and r["steps"] == 8 for r in lines)
    assert all(r["val"][-1][1] < r["val"][0][1] + 0.5 and math.isfinite(r["final_val"]) for r in lines)
    written = json.loads((tmp_path / "fidelity.json").read_text())
    assert written["rows"] == result["rows"] and len(written["rows"]) == len(jobs)
    assert (tmp_path / "fidelity.png").stat().st_size > 20_000
    assert (tmp_path / "fidelity.md").read_text().count("\n") == len(jobs) + 2
    loss = {(r["group"], r["name"]): r["final_val"] for r in lines}
    rows = {(r["group"], r["name"]): r for r in written["rows"]}
    dense, base = loss[("frontier", "dense")], loss[("frontier", "subspace k=4 fixed U")]
    row = rows[("embed", "per-stage token tables")]
    assert row["vs_dense"] == pytest.approx(loss[("embed", "per-stage token tables")] / dense - 1)
    assert row["vs_base"] == pytest.approx(loss[("embed", "per-stage token tables")] / base - 1)
    assert rows[("scale", "d=128 subspace k=8")]["vs_dense"] == \
        pytest.approx(loss[("scale", "d=128 subspace k=8")] / loss[("scale", "d=128 dense")] - 1)
    # the compression axis is payload bytes: bf16 k = d/16 is 16x, int8 at twice the rank a little less
    assert rows[("frontier", "subspace k=4 fixed U")]["compression"] == 16
    assert rows[("frontier", "subspace int8 k=8 fixed U")]["compression"] == pytest.approx(128 / 10)
    # the hybrid (issue 24) sends its k + b numbers: 16x like the subspace row it is set beside
    assert rows[("hybrid", "hybrid k=3 b=1, stages lr x0.03")]["compression"] == 16
    assert [r["spec"]["residual_width"] for r in lines if r["name"] == "hybrid k=3 b=1"] == [1]
    tuned = next(r["spec"] for r in lines if r["name"] == "hybrid k=3 b=1, stages lr x0.1, warm-up x3")
    assert (tuned["constrained_stage_lr_scale"], tuned["residual_width"]) == (0.1, 1)
    # the re-fitted rows really switched U; the fixed ones never did
    assert all(r["switches"] >= 1 for r in lines if r["spec"]["basis_updates"])
    assert all(r["switches"] == 0 for r in lines if not r["spec"]["basis_updates"])


@pytest.mark.e2e
def test_fidelity_budget_ends_on_time_and_accounts_for_every_job(tmp_path):
    """Jobs far longer than the budget: the bench still ends within budget + grace, the first job
    (started on an optimistic prior speed) is cut at the deadline with a held-out loss at the step it
    reached, the next ones are skipped by the speed measured on it, and every job has a row."""
    long = plan_shape("smoke").base.replace(total_steps=1_000_000)
    slow = [Job(f"long {i}", "frontier", long.replace(seed=i)) for i in range(3)]
    t0 = time.time()
    results = run_queue(slow, tmp_path, None, "cpu", 1, 1, budget_s=12, reserve_s=2, grace_s=15, eval_batches=1,
                        prior=(0.0, 1e18))
    assert time.time() - t0 < 12 + 15
    assert sorted(r["name"] for r in results) == ["long 0", "long 1", "long 2"]
    cut = [r for r in results if r["truncated"]]
    assert len(cut) == 1 and 0 < cut[0]["steps"] < 1_000_000 and math.isfinite(cut[0]["final_val"])
    assert cut[0]["val"][-1][0] == cut[0]["tokens"]  # the last held-out loss is at the step it reached
    others = [r for r in results if not r["truncated"]]
    assert all(r["error"].startswith("skipped: needs") and r["steps"] == 0 for r in others)
    lines = [json.loads(x) for x in (tmp_path / "fidelity.jsonl").read_text().splitlines()]
    assert sorted(r["name"] for r in lines) == ["long 0", "long 1", "long 2"]


def test_plans_are_consistent():
    """Within a group every job trains the same tokens; the GPU plan's scale jobs are d >= 1024 at ~100x
    with >= 20M tokens, and its frontier covers k = d/64 .. d/8."""
    for plan in ("gpu", "cpu", "smoke"):
        jobs = jobs_for(plan, ALL_GROUPS)
        for g in ALL_GROUPS:
            assert len({j.tokens for j in jobs if j.group == g}) <= 1, (plan, g)
    gpu = jobs_for("gpu")
    big = [j for j in gpu if j.group == "scale" and j.spec.d_model >= 1024]
    assert {j.spec.codec for j in big} == {"dense", "subspace"}
    assert all(j.tokens >= 20e6 and j.spec.dtype == "bf16" for j in big)
    assert [j.compression() for j in big if j.spec.codec == "subspace"] == [pytest.approx(102.4)]
    ranks = {j.spec.rank for j in gpu
             if j.group == "frontier" and j.spec.codec == "subspace" and j.spec.quant == "none"}
    assert ranks == {8, 16, 32, 64}
    assert sum(estimated_seconds(j, "cuda") for j in gpu) / 4 < 540


@pytest.mark.e2e
def test_fidelity_resume_runs_only_the_missing_jobs(tmp_path):
    first = run_fidelity_bench(str(tmp_path), smoke=True, groups=("embed",), budget_s=120)
    assert [r["name"] for r in first["jobs"]] == ["per-stage token tables"]
    again = run_fidelity_bench(str(tmp_path), smoke=True, groups=("optimizer", "embed"), budget_s=120, resume=True)
    kept = next(r for r in again["jobs"] if r["group"] == "embed")
    assert kept == first["jobs"][0]  # taken over as it was, not trained again
    assert sorted(r["group"] for r in again["jobs"]) == ["embed", "optimizer", "optimizer"]
    lines = (tmp_path / "fidelity.jsonl").read_text().splitlines()
    assert len(lines) == 3
    fresh = run_fidelity_bench(str(tmp_path), smoke=True, groups=("embed",), budget_s=120)
    assert fresh["jobs"][0]["finished_s"] != first["jobs"][0]["finished_s"]  # without --resume: trained anew
    assert len((tmp_path / "fidelity.jsonl").read_text().splitlines()) == 1


@pytest.mark.e2e
def test_fidelity_gap_groups_smoke(tmp_path):
    """The gap group (docs/fidelity.md 3d) at smoke size: every job trains, each row is compared with its
    own group's dense and baseline, the full-width row sends d numbers, the write ratios are measured."""
    result = run_fidelity_bench(str(tmp_path), smoke=True, parallel=2, budget_s=300, groups=("gap",))
    jobs = {j.name: j for j in jobs_for("smoke", ("gap",))}
    res = {r["name"]: r for r in result["jobs"]}
    assert sorted(res) == sorted(jobs)
    assert all(not r["error"] and not r["truncated"] and r["steps"] == 8 for r in res.values())
    rows = {r["name"]: r for r in result["rows"]}
    dense, base = res["dense"]["final_val"], res["subspace k=4 fixed U"]["final_val"]
    for name in ("constrained stages lr x8", "one boundary, layers 1-3", "T_fixed std 1"):
        assert rows[name]["vs_dense"] == pytest.approx(res[name]["final_val"] / dense - 1)
        assert rows[name]["vs_base"] == pytest.approx(res[name]["final_val"] / base - 1)
    assert res["full-width boundaries"]["boundary"] == "full" and rows["full-width boundaries"]["compression"] == 1
    assert res["full-width boundaries"]["write_ratio"] == [] and res["dense"]["write_ratio"] == []
    assert len(res["subspace k=4 fixed U"]["write_ratio"]) == 2
    assert len(res["one boundary, layers 1-3"]["write_ratio"]) == 1
    # lr x0.001 leaves the constrained stages near their initial weights: they write far less than at x8
    assert max(res["constrained stages lr x0.001"]["write_ratio"]) < min(res["constrained stages lr x8"]["write_ratio"])
    assert res["constrained stages lr x8"]["spec"]["constrained_stage_lr_scale"] == 8.0


def test_full_width_boundaries_train_the_uncompressed_constrained_model():
    """fp64: a pipeline whose boundaries send h itself trains as the reference chained on the raw hidden
    state (protocol/reference.py, boundary=False), and as the compressed pipeline (the codec is exact)."""
    spec = preset("tiny", d_model=32, n_heads=2, d_ff=64, seq_len=16, n_layers=3, stages=3, batch_size=4,
                  microbatch_size=4, rank=4, dtype="fp64", wire_dtype="fp64", lr=1e-3, basis_updates=False)
    src = BatchSource(load_corpus(None, seq_len=16), 16, 4, seed=7)
    full, codec = InProcessPipeline(spec, serialize=False), InProcessPipeline(spec, serialize=False)
    full_width_boundaries(full)
    ref = ReferenceModel(spec, boundary=False)
    lf, lc, lr_ = [], [], []
    for step in range(20):
        lf.append(full.train_step(step, src.microbatch).loss)
        lc.append(codec.train_step(step, src.microbatch).loss)
        lr_.append(ref.train_step(src.microbatch))
    assert max(abs(a - b) / b for a, b in zip(lf, lr_)) < 1e-12
    assert max(abs(a - b) / b for a, b in zip(lf, lc)) < 1e-10
    assert lf[-1] < lf[0] - 0.1  # it trained
    tokens = src.microbatch(0, 0)[:, :-1]
    assert full.runners[0].module(tokens).shape[-1] == spec.d_model
    assert codec.runners[0].module(tokens).shape[-1] == spec.rank
    with pytest.raises(ValueError, match="fixed basis"):
        full_width_boundaries(InProcessPipeline(spec.replace(basis_updates=True), serialize=False))


def test_dense_repeats_add_runs_of_each_dense_job_with_its_spec():
    jobs = jobs_for("smoke", ALL_GROUPS)
    dense = [j for j in jobs if j.spec.codec == "dense"]
    three = with_dense_repeats(jobs, 3)
    assert dense and len(three) == len(jobs) + 2 * len(dense)
    assert len({j.key for j in three}) == len(three)
    by_key = {j.key: j for j in three}
    for j in dense:
        runs = [by_key[j.key], by_key[f"{j.key} (run 2)"], by_key[f"{j.key} (run 3)"]]
        assert all(r.spec == j.spec and r.priority == j.priority and r.boundary == j.boundary for r in runs)
    assert [j for j in three if j.spec.codec != "dense"] == [j for j in jobs if j.spec.codec != "dense"]
    assert with_dense_repeats(jobs, 1) == jobs
    with pytest.raises(ValueError, match="at least 1"):
        with_dense_repeats(jobs, 0)


@pytest.mark.parametrize("n", ["0", "-2", "two"])
def test_dense_runs_flag_below_one_is_an_argparse_error(n, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["bench", "fidelity", "--dense-runs", n])
    assert e.value.code == 2 and "at least 1" in capsys.readouterr().err


def _result(group: str, name: str, loss: float, codec: str = "subspace", truncated: bool = False) -> dict:
    return {"group": group, "name": name, "final_val": loss, "truncated": truncated, "error": "", "note": "",
            "compression": 1.0 if codec == "dense" else 16.0, "tokens": 1000, "spec": {"codec": codec, "d_model": 64}}


@pytest.mark.parametrize("group,ref,row", [("frontier", "dense", "subspace k=4 fixed U"),
                                           ("headline", "dense", "subspace k=d/16, issue defaults"),
                                           ("scale", "d=64 dense", "d=64 subspace k=4"),
                                           ("hybrid", "dense", "hybrid k=3 b=1")])
def test_dense_reference_is_the_mean_of_its_ok_runs(group, ref, row):
    """Every kind of dense reference: the mean of the dense job and its repeats (1.0, 1.2; a truncated
    repeat at 5.0 left out), for the other rows and for the dense runs' own rows alike."""
    results = [_result(group, ref, 1.0, "dense"), _result(group, f"{ref} (run 2)", 1.2, "dense"),
               _result(group, f"{ref} (run 3)", 5.0, "dense", truncated=True), _result(group, row, 1.21)]
    rows = {r["name"]: r for r in summarize(results)}
    assert abs(rows[row]["vs_dense"] - (1.21 / 1.1 - 1)) < 1e-12
    assert abs(rows[ref]["vs_dense"] - (1.0 / 1.1 - 1)) < 1e-12
    assert abs(rows[f"{ref} (run 2)"]["vs_dense"] - (1.2 / 1.1 - 1)) < 1e-12
    assert rows[f"{ref} (run 3)"]["vs_dense"] is None
    assert rows[ref]["dense_runs"] == 2 and abs(rows[ref]["dense_spread"] - 0.2) < 1e-12
    assert all("dense_runs" not in r for name, r in rows.items() if name != ref)
    table = markdown_table(list(rows.values())).splitlines()
    assert [line for line in table if "mean of 2 runs" in line] == [next(x for x in table if f"| {ref} |" in x)]


def test_dense_runs_are_jobs_that_resume_keeps(tmp_path, monkeypatch):
    """run_fidelity_bench with a stand-in queue (no processes): --dense-runs 2 after a run of 1 with
    --resume trains only the repeat, and the headline is compared with the mean of both dense runs."""
    losses = {"dense": 1.0, "dense (run 2)": 1.2, "subspace k=d/16, issue defaults": 1.21}
    asked = []

    def queue(jobs, out, *args, **kw):
        asked.append([j.name for j in jobs])
        res = [dataclasses.asdict(JobResult(j.name, j.group, j.spec.to_dict(), j.note, j.compression(),
                                            j.spec.total_steps, j.tokens, losses[j.name])) for j in jobs]
        with (out / "fidelity.jsonl").open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in res)
        return res

    monkeypatch.setattr(fidelity, "run_queue", queue)
    run_fidelity_bench(str(tmp_path), smoke=True, groups=("headline",))
    result = run_fidelity_bench(str(tmp_path), smoke=True, groups=("headline",), dense_runs=2, resume=True)
    assert asked == [["dense", "subspace k=d/16, issue defaults"], ["dense (run 2)"]]
    rows = {r["name"]: r for r in json.loads((tmp_path / "fidelity.json").read_text())["rows"]}
    assert rows == {r["name"]: r for r in result["rows"]} and result["dense_runs"] == 2
    assert abs(rows["subspace k=d/16, issue defaults"]["vs_dense"] - (1.21 / 1.1 - 1)) < 1e-12
    assert rows["dense"]["dense_runs"] == 2
    with pytest.raises(ValueError, match="at least 1"):
        run_fidelity_bench(str(tmp_path / "none"), smoke=True, dense_runs=0)
    assert not (tmp_path / "none").exists()

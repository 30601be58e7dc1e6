"""`swarm bench record`: the figures it reports are those of its two parts (the training curves and
the swarms' tokens/s), combined as its docstring states; `--resume` reuses both parts."""
from __future__ import annotations

import json

import pytest

from swarm.bench.record.bench import (
    _reusable_runs,
    combine,
    record_figures,
    record_specs,
    run_record_bench,
    swarm_of,
    swarm_specs,
)
from swarm.bench.record.throughput import merge_throughput
from swarm.bench.record.time_to_loss import variant_of


def _curve(codec: str, points: list[tuple[float, float]], batch: int = 4, seq: int = 8) -> dict:
    return {"spec": {"codec": codec, "batch_size": batch, "seq_len": seq}, "val": [list(p) for p in points]}


def test_figures_interpolate_the_target_and_split_x_sooner_into_speed_and_steps():
    curves = {"dense": _curve("dense", [(320, 3.0), (640, 2.0)]),
              "subspace": _curve("subspace", [(320, 2.4), (640, 1.8)]),
              "bottleneck": _curve("bottleneck", [(320, 2.9), (640, 2.5)])}
    tps = {"dense": 100.0, "subspace": 700.0, "bottleneck": 800.0}
    rows = record_figures(curves, tps, target=2.0)
    sub, dense, bott = rows["subspace"], rows["dense"], rows["bottleneck"]
    assert dense["tokens_to_target"] == 640 and dense["steps_to_target"] == 640 / 32
    assert sub["tokens_to_target"] == pytest.approx(320 + 320 * 0.4 / 0.6, rel=1e-12)
    assert sub["seconds_to_target"] == pytest.approx(sub["tokens_to_target"] / 700.0, rel=1e-12)
    assert sub["speed_ratio"] == 7.0 and sub["steps_ratio"] == pytest.approx(sub["tokens_to_target"] / 640)
    assert sub["x_sooner"] == pytest.approx(sub["speed_ratio"] / sub["steps_ratio"], rel=1e-12)
    assert sub["x_sooner"] == pytest.approx((640 / 100.0) / sub["seconds_to_target"], rel=1e-12)
    # never reached: no ratio, only the bound had it reached the target right after its last step
    assert bott["tokens_to_target"] is None and bott["x_sooner"] is None and bott["steps_ratio"] is None
    assert bott["x_sooner_at_most"] == pytest.approx((640 / 100.0) / (640 / 800.0), rel=1e-12)


def test_codec_tokens_lengthen_only_the_compressed_codecs():
    specs = record_specs(12_000_000, codec_tokens=3.0)
    assert list(specs) == ["dense", "subspace", "bottleneck", "subspace-lr0.03", "subspace-16x-lr0.03"]
    assert {s.d_model for s in specs.values()} == {1024} and specs["dense"].n_stages == 8
    steps = specs["dense"].total_steps
    assert steps == 12_000_000 // (64 * 256)
    assert all(s.total_steps == round(3 * steps) for n, s in specs.items() if n != "dense")
    assert specs["subspace"].rank == 10 and not specs["subspace"].basis_updates


def test_the_lever_variants_change_only_the_stage_lr_and_the_width_and_share_swarms_by_width():
    specs = record_specs(1_000_000)
    lever, wide = specs["subspace-lr0.03"], specs["subspace-16x-lr0.03"]
    assert lever == specs["subspace"].replace(constrained_stage_lr_scale=0.03)
    assert wide == lever.replace(rank=1024 // 16) and wide.rank == 64
    assert specs["subspace"].constrained_stage_lr_scale == 1.0
    # the lr moves no byte and no FLOP: one swarm per (codec, width), in the variants' order
    swarms = swarm_specs(specs)
    assert list(swarms) == ["dense", "subspace", "bottleneck", "subspace-16x"]
    assert [swarm_of(n) for n in specs] == ["dense", "subspace", "bottleneck", "subspace", "subspace-16x"]
    assert swarms["subspace-16x"].rank == 64 and swarms["subspace"].rank == 10
    assert list(record_specs(1_000_000, variants=("dense", "subspace-16x-lr0.03"))) == ["dense", "subspace-16x-lr0.03"]
    named = record_specs(1_000_000, variants=("dense", "bottleneck-lr0.03"))["bottleneck-lr0.03"]  # named only
    assert (named.codec, named.constrained_stage_lr_scale, named.rank) == ("bottleneck", 0.03, specs["bottleneck"].rank)
    assert swarm_of("bottleneck-lr0.03") == "bottleneck"
    with pytest.raises(ValueError, match="dense is the reference"):
        record_specs(1_000_000, variants=("subspace",))
    with pytest.raises(ValueError, match="not subspace-8x"):
        record_specs(1_000_000, variants=("dense", "subspace-8x"))


def _run(variant: str, codec: str, link: str, tps: float) -> dict:
    return {"codec": codec, "variant": variant, "bandwidth": link, "shaping": "builtin" if link != "unlimited"
            else "none", "tokens_per_second": tps, "roofline_tokens_per_second": tps, "forward_bytes_per_token": 8.0,
            "dense_forward_bytes_per_token": 64.0, "peers": [{"bytes_sent_per_token": 16.0}], "steps": 8}


def test_combine_takes_each_variants_tokens_per_second_from_its_own_swarm():
    specs = record_specs(1_000_000, variants=("dense", "subspace", "subspace-lr0.03", "subspace-16x-lr0.03"))
    curves = {n: {**_curve(s.codec, [(16384, 3.0), (32768, 2.0 - 0.1 * i)], 64, 256), "seconds": 1.0}
              for i, (n, s) in enumerate(specs.items())}
    conv = {"curves": curves, "data": "d", "tokens": 10, "device": "cuda", "machine": {}, "dtype": "bf16"}
    tps = {"dense": 100.0, "subspace": 600.0, "subspace-16x": 500.0, "bottleneck": 1.0}
    runs = [_run(v, "subspace" if v != "dense" else "dense", link, t) for v, t in tps.items()
            for link in ("unlimited", "200mbit")]
    tp = {"runs": runs, "latency": "50ms", "device": "cuda", "machine": {}, "stages": 8, "preset": "record"}
    result = combine(conv, tp, "200mbit", specs)
    rows = result["target_dense_final"]["codecs"]
    assert {n: r["tokens_per_second"] for n, r in rows.items()} == \
        {"dense": 100.0, "subspace": 600.0, "subspace-lr0.03": 600.0, "subspace-16x-lr0.03": 500.0}
    assert set(result["throughput"]["link"]) == {"dense", "subspace", "subspace-16x"}  # no bottleneck: not asked
    assert result["variants"]["subspace-16x-lr0.03"] == {"codec": "subspace", "rank": 64, "compression": 16.0,
                                                         "constrained_stage_lr_scale": 0.03, "swarm": "subspace-16x"}
    assert [h for h, _ in result["hours"]["subspace-16x-lr0.03"]] == pytest.approx([16384 / 500 / 3600,
                                                                                    32768 / 500 / 3600])


@pytest.mark.e2e  # local swarms of real processes, and two training runs
def test_record_bench_smoke_reports_its_parts_figures_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("swarm.bench.record.convergence.os.cpu_count", lambda: 1)  # one torch thread, as in every test
    result = run_record_bench(str(tmp_path), data=None, smoke=True)
    assert (tmp_path / "record.png").stat().st_size > 10_000
    written = json.loads((tmp_path / "record.json").read_text())
    conv = json.loads((tmp_path / "convergence.json").read_text())
    tp = json.loads((tmp_path / "throughput.json").read_text())
    assert written == json.loads(json.dumps(result))
    assert written["codecs"] == ["dense", "subspace", "subspace-lr0.03"] and written["bandwidth"] == "200mbit"
    assert {variant_of(r) for r in tp["runs"]} == {"dense", "subspace"}  # the lr variant has subspace's swarm
    assert written["latency"] == "50ms" == tp["latency"]
    assert written["model"]["parameters"] > 0 and written["model"]["tokenizer"].startswith("bytes")
    link = {r["codec"]: r["tokens_per_second"] for r in tp["runs"] if r["bandwidth"] == "200mbit"}
    link["subspace-lr0.03"] = link["subspace"]
    dense_final = conv["curves"]["dense"]["val"][-1][1]
    assert written["target_dense_final"]["loss"] == dense_final
    for key in ("target_dense_final", "target_common"):
        rows = written[key]["codecs"]
        for name, r in rows.items():
            curve = conv["curves"][name]
            assert r["tokens_per_second"] == link[name] and r["final_val"] == curve["val"][-1][1]
            assert r["tokens_per_step"] == curve["spec"]["batch_size"] * curve["spec"]["seq_len"]
            assert r["speed_ratio"] == pytest.approx(link[name] / link["dense"], rel=1e-12)
            if r["steps_to_target"] is None:
                continue
            assert r["seconds_to_target"] == pytest.approx(
                r["steps_to_target"] * r["tokens_per_step"] / r["tokens_per_second"], rel=1e-9)
            assert r["x_sooner"] == pytest.approx(r["speed_ratio"] / r["steps_ratio"], rel=1e-9)
    common = written["target_common"]
    assert common["loss"] == max(c["val"][-1][1] for c in conv["curves"].values())
    assert all(r["x_sooner"] is not None for r in common["codecs"].values())  # every codec reaches the highest
    for name, pts in written["hours"].items():
        val = conv["curves"][name]["val"]
        assert [loss for _, loss in pts] == [loss for _, loss in val]
        assert [h for h, _ in pts] == pytest.approx([t / link[name] / 3600 for t, _ in val], rel=1e-12)
    # --resume: both parts reused, no training and no swarm, the same figures
    capsys.readouterr()
    again = run_record_bench(str(tmp_path), data=None, smoke=True, resume=True)
    out = capsys.readouterr().out
    assert "reusing the training curves" in out and "reusing the throughput rows" in out
    assert json.loads(json.dumps(again)) == written
    # a curve that is not there (or was trained with another spec) is trained, the others are kept
    conv["curves"]["subspace"]["spec"]["lr"] *= 2
    del conv["curves"]["subspace-lr0.03"]
    (tmp_path / "convergence.json").write_text(json.dumps(conv))
    capsys.readouterr()
    third = run_record_bench(str(tmp_path), data=None, smoke=True, resume=True, parts=("curves",))
    out = capsys.readouterr().out
    assert "reusing the training curves" in out and ": dense\n" in out and "reusing the throughput rows" in out
    merged = json.loads((tmp_path / "convergence.json").read_text())
    assert merged["reused_curves"] == ["dense"] and list(merged["curves"]) == ["dense", "subspace", "subspace-lr0.03"]
    assert merged["curves"]["dense"] == conv["curves"]["dense"]
    # the same seeds and data: the retrained curves are the first run's (fp32 on one CPU thread)
    assert json.loads(json.dumps(third))["target_dense_final"] == written["target_dense_final"]


def test_resume_keeps_the_earlier_swarms_rows_and_merges_the_new_ones(tmp_path):
    specs = record_specs(1_000_000)
    swarms = swarm_specs(specs)
    earlier = [_run(v, "dense", link, 10.0) for v in ("dense", "subspace") for link in ("unlimited", "200mbit")]
    earlier.append(_run("bottleneck", "bottleneck", "200mbit", 5.0))  # its unshaped run is missing: not reusable
    (tmp_path / "throughput.json").write_text(json.dumps({"preset": "record", "latency": "50ms", "runs": earlier}))
    old, runs = _reusable_runs(tmp_path / "throughput.json", "record", "50ms", "200mbit", True, swarms)
    assert [variant_of(r) for r in runs] == ["dense", "dense", "subspace", "subspace"]
    assert _reusable_runs(tmp_path / "throughput.json", "record", "10ms", "200mbit", True, swarms) == (None, [])
    # without the ceiling, the bottleneck's shaped row is enough
    assert "bottleneck" in {variant_of(r) for r in _reusable_runs(
        tmp_path / "throughput.json", "record", "50ms", "200mbit", False, swarms)[1]}
    new = {"runs": [_run("subspace-16x", "subspace", link, 40.0) for link in ("unlimited", "200mbit")],
           "bandwidths": ["200mbit"], "preset": "record", "device": "cuda", "latency": "50ms"}
    merged = merge_throughput(new, runs, tmp_path)
    written = json.loads((tmp_path / "throughput.json").read_text())
    assert written == json.loads(json.dumps(merged)) and (tmp_path / "throughput.png").stat().st_size > 5_000
    assert merged["reused_runs"] == ["dense", "subspace"] and len(merged["runs"]) == 6
    assert merged["ratios"]["subspace-16x_over_dense_limited"] == pytest.approx(4.0)

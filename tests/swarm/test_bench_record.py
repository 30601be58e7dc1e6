"""`swarm bench record`: the figures it reports are those of its two parts (the training curves and
the swarms' tokens/s), combined as its docstring states; `--resume` reuses both parts."""
from __future__ import annotations

import json

import pytest

from swarm.bench.record import record_figures, record_specs, run_record_bench


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
    assert list(specs) == ["dense", "subspace", "bottleneck"]
    assert {s.d_model for s in specs.values()} == {1024} and specs["dense"].n_stages == 8
    steps = specs["dense"].total_steps
    assert steps == 12_000_000 // (64 * 256)
    assert specs["subspace"].total_steps == specs["bottleneck"].total_steps == round(3 * steps)
    assert specs["subspace"].rank == 10 and not specs["subspace"].basis_updates


@pytest.mark.e2e  # local swarms of real processes, and two training runs
def test_record_bench_smoke_reports_its_parts_figures_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("swarm.bench.convergence.os.cpu_count", lambda: 1)  # one torch thread, as in every test
    result = run_record_bench(str(tmp_path), data=None, smoke=True)
    assert (tmp_path / "record.png").stat().st_size > 10_000
    written = json.loads((tmp_path / "record.json").read_text())
    conv = json.loads((tmp_path / "convergence.json").read_text())
    tp = json.loads((tmp_path / "throughput.json").read_text())
    assert written == json.loads(json.dumps(result))
    assert written["codecs"] == ["dense", "subspace"] and written["bandwidth"] == "200mbit"
    assert written["latency"] == "50ms" == tp["latency"]
    assert written["model"]["parameters"] > 0 and written["model"]["tokenizer"].startswith("bytes")
    link = {r["codec"]: r["tokens_per_second"] for r in tp["runs"] if r["bandwidth"] == "200mbit"}
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

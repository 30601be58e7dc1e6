"""`swarm bench scale` at smoke size: the whole model trained in one process, and a real one-stage
swarm of two heads (pure data parallel, separate processes over libp2p) whose steps both heads
computed; ratios consistent with the rates; `--resume` keeps what was measured and runs nothing again."""
from __future__ import annotations

import json
import time

import pytest

from swarm.bench.hardware import scale
from swarm.bench.hardware.scale import parse_layouts, run_scale_bench


def test_layouts_parse_and_bad_ones_say_how_to_write_them():
    assert parse_layouts("1x1, 1x2,2X1") == [(1, 1), (1, 2), (2, 1)]
    for bad in ("2", "1x0", "axb", ""):
        with pytest.raises(ValueError, match="1x1,1x2,2x1"):
            parse_layouts(bad)


@pytest.mark.e2e
def test_scale_bench_smoke_and_resume(tmp_path):
    result = run_scale_bench(str(tmp_path), smoke=True)
    written = json.loads((tmp_path / "scale.json").read_text())
    assert written["ratios"] == result["ratios"]
    assert (tmp_path / "scale.png").stat().st_size > 10_000
    base = written["one_process"]["tokens_per_second"]
    [row] = written["runs"]
    assert (row["stages"], row["replicas"], row["peers"]) == (1, 2, 2)
    assert len(row["step_seconds"]) == written["config"]["steps"]
    assert base > 0 and row["tokens_per_second"] > 0 and row["slowest_over_median"] >= 1.0
    assert abs(written["ratios"]["1x2_over_one_process"] - row["tokens_per_second"] / base) < 1e-12
    assert row["final_loss"] < row["first_loss"] - 0.1  # the two heads' steps trained the model
    # both heads' worker threads computed (one figure a peer, stage by stage, replicas in order)
    assert len(row["worker_busy"]) == 2 and all(0 < b for b in row["worker_busy"]), row["worker_busy"]
    assert row["completed"] and row["steps_done"] == written["config"]["steps"] and row["seconds_to_first_step"] > 0
    again = run_scale_bench(str(tmp_path), smoke=True, resume=True)
    assert again["runs"] == written["runs"] and again["one_process"] == written["one_process"]


class SlowSwarm:
    """A stand-in for `LocalSwarm` whose head reports a step every 0.1 s and never says done."""

    def __init__(self, opts) -> None:
        self.opts, self.t0, self.stopped = opts, None, False

    def start(self) -> None:
        self.t0 = time.time()

    def step_events(self) -> tuple[list[dict], bool]:
        n = int((time.time() - self.t0) / 0.1)
        return [{"step": i + 1, "time": self.t0 + 0.1 * (i + 1), "seconds": 0.1, "tokens": 1000, "loss": 5.0 - i / 100}
                for i in range(n)], False

    def _check_alive(self) -> None:
        pass

    def stop(self, grace: float = 15.0) -> None:
        self.stopped = True

    def metrics(self, records: list[dict]) -> dict:
        return {"sync": {"max_bytes_per_step": 0.0, "commit_seconds": 0.0, "commit_parts": {}}, "peers": []}


def test_a_layout_past_its_time_limit_keeps_what_it_did(tmp_path, monkeypatch):
    monkeypatch.setattr(scale, "LocalSwarm", SlowSwarm)
    result = run_scale_bench(str(tmp_path), preset_name="tiny", layouts="2x1", steps=10_000, warmup=2,
                             baseline=False, limit_s=1.0)
    [row] = result["runs"]
    assert not row["completed"] and 5 <= row["steps_done"] < 10_000
    assert len(row["step_seconds"]) == row["steps_done"] and row["seconds_to_first_step"] > 0
    assert abs(row["tokens_per_second"] - 10_000) < 1e-6  # 1000 tokens in 0.1 s, the first 2 steps untimed
    assert json.loads((tmp_path / "scale.json").read_text())["runs"] == [row]


def test_the_batch_and_the_window_reach_every_layout_and_the_config(tmp_path, monkeypatch):
    specs = []

    class Recorded(SlowSwarm):
        def __init__(self, opts) -> None:
            super().__init__(opts)
            specs.append(opts.spec)
    monkeypatch.setattr(scale, "LocalSwarm", Recorded)
    kw = dict(preset_name="tiny", layouts="2x1", steps=10_000, warmup=2, baseline=False, limit_s=0.3)
    run_scale_bench(str(tmp_path), batch_size=64, in_flight=3, **kw)
    assert (specs[0].batch_size, specs[0].microbatches_in_flight, specs[0].n_stages) == (64, 3, 2)
    config = json.loads((tmp_path / "scale.json").read_text())["config"]
    assert (config["batch_size"], config["microbatches_in_flight"]) == (64, 3)
    # another batch is another configuration: nothing of the first is resumed
    again = run_scale_bench(str(tmp_path), batch_size=32, resume=True, **kw)
    assert len(again["runs"]) == 1 and specs[1].batch_size == 32 and specs[1].microbatches_in_flight == 0
    assert "microbatches_in_flight" not in again["config"]  # unset options stay out: old JSONs still resume


def test_rounds_interleave_the_layouts_take_medians_and_resume_with_more_rounds(tmp_path, monkeypatch):
    started, base = [], iter([100.0, 300.0, 200.0, 250.0])  # the one-process runs' tokens/s, round by round

    class Paced(SlowSwarm):  # each swarm's steps take longer than the last one's: 10,000, 5,000, 3,333 ... tok/s
        def __init__(self, opts) -> None:
            super().__init__(opts)
            started.append((opts.spec.n_stages, opts.replicas))
            self.pace = 0.1 * len(started)

        def step_events(self) -> tuple[list[dict], bool]:
            n = min(6, int((time.time() - self.t0) / 0.01))
            return [{"step": i + 1, "time": self.t0, "seconds": self.pace, "tokens": 1000, "loss": 5.0}
                    for i in range(n)], n == 6

        def wait_for_head(self) -> None:
            pass
    monkeypatch.setattr(scale, "LocalSwarm", Paced)
    monkeypatch.setattr(scale, "_one_process", lambda *a: {"tokens_per_second": next(base), "device": "cpu",
                                                              "median_step_seconds": 1.0})
    kw = dict(preset_name="tiny", layouts="2x1,1x2", steps=6, warmup=2)
    result = run_scale_bench(str(tmp_path), repeat=3, **kw)
    assert started == [(2, 1), (1, 2)] * 3  # round by round, every layout once a round
    assert [(r["stages"], r["replicas"], r["round"]) for r in result["runs"]] == \
        [(2, 1, 0), (1, 2, 0), (2, 1, 1), (1, 2, 1), (2, 1, 2), (1, 2, 2)]
    rate = {i: 1000 / (0.1 * i) for i in range(1, 8)}  # the i-th swarm's tokens/s
    assert result["one_process"]["tokens_per_second"] == 200.0  # median of 100, 300, 200
    assert result["ratios"]["2x1_over_one_process"] == pytest.approx(rate[3] / 200.0)  # median of swarms 1, 3, 5
    assert result["ratios"]["1x2_over_2x1"] == pytest.approx(rate[4] / rate[3])  # of 2, 4, 6 against 1, 3, 5
    s = result["spread"]["2x1"]
    assert (s["rounds"], s["min"], s["max"]) == (3, pytest.approx(rate[5]), pytest.approx(rate[1]))
    assert s["spread"] == pytest.approx((rate[1] - rate[5]) / rate[3])
    assert result["spread"]["one_process"]["spread"] == pytest.approx((300 - 100) / 200)
    assert (tmp_path / "scale.png").stat().st_size > 10_000
    # one more round on top of the JSON: only round 4 runs
    again = run_scale_bench(str(tmp_path), repeat=4, resume=True, **kw)
    assert started[6:] == [(2, 1), (1, 2)] and len(again["runs"]) == 8 and len(again["one_process_runs"]) == 4
    assert again["one_process"]["tokens_per_second"] == 225.0 and again["spread"]["1x2"]["rounds"] == 4
    with pytest.raises(ValueError, match="--repeat 0 runs nothing"):
        run_scale_bench(str(tmp_path), repeat=0, **kw)

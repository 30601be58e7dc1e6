"""`swarm bench simulate --record-setting`: the simulator's prediction for the public record's setting beside the
measured swarm (swarm/bench/simulate/record_setting.py, record_measure.py), and the send order it now models."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from protocol.spec import RunSpec
from swarm.bench.simulate.engine import SendLine, now, run_virtual
from swarm.bench.simulate.hardware import LinkDraw, StageWork
from swarm.bench.simulate.record_measure import work_of
from swarm.bench.simulate.validate import Case, simulated
from swarm.net.home_link import Packets

ROOT = Path(__file__).resolve().parents[2]
FRAME_S = 0.004  # the cost per frame of the stand-in swarm below
# seconds per microbatch of tiny's 3 stages: forward (the tail's with its backward), backward, the optimizer step
WORK = StageWork((0.010, 0.010, 0.020), (0.010, 0.010, 0.0), (0.002, 0.002, 0.002))


def _calibrated(spec: RunSpec, threads: int, repeats: int = 3, device: str = "cpu") -> StageWork:
    return WORK


def _stand_in(spec: RunSpec, steps: int, device: str, threads: int, bandwidth: str | None, latency: str) -> dict:
    """A "real" swarm made by the simulator itself with a known cost per frame (no processes: the test stays
    fast): what the prediction must give back."""
    sim = simulated(spec, WORK, Case(spec.codec, 1, bandwidth or "unlimited", latency if bandwidth else "0"),
                    steps, os.cpu_count() or 1, FRAME_S)
    return {"bandwidth": bandwidth or "unlimited", "latency": latency, "tokens_per_second": sim["tokens_per_second"],
            "step_seconds": [], "median_step_s": sim["median_step_s"], "mean_step_s": sim["median_step_s"],
            "commit_s": sim["median_commit_s"], "peers": [], "frames": []}


def _first_run(out: Path) -> dict:
    """The smoke run of the mode (tiny, 3 stages, dense and subspace), its swarms and calibration stood in for."""
    from swarm.bench.simulate.record_setting import run_record_setting
    room = "swarm.bench.simulate.record_measure"
    with mock.patch(f"{room}.calibrate", _calibrated), mock.patch(f"{room}.swarm_run", _stand_in):
        return run_record_setting(str(out), smoke=True)


def _nothing_runs(*args, **kwargs):
    raise AssertionError("a measured swarm was measured again")


def test_record_setting_smoke_writes_predicted_beside_measured_and_reuses_a_measurement(tmp_path):
    from swarm.bench.simulate.record_setting import TOLERANCE, run_record_setting

    result = _first_run(tmp_path / "first")
    measured = json.loads((tmp_path / "first" / "record_measured.json").read_text())
    assert (tmp_path / "first" / "simulate_record.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "first" / "simulate_record.json").read_text()) == result
    assert [c["variant"] for c in result["cases"]] == ["dense", "subspace"]
    assert result["setting"]["bandwidth"] == "200mbit" and result["setting"]["latency"] == "50ms"
    for case in result["cases"]:
        m, p = case["measured"], case["predicted"]
        assert m["tokens_per_second"] > 0 and p["tokens_per_second"] > 0 and p["seconds_per_step"] > 0
        assert case["ratio"] == pytest.approx(p["tokens_per_second"] / m["tokens_per_second"])
        assert case["within"] == (abs(case["ratio"] - 1) <= TOLERANCE)
        # the stand-in is the model with a known cost per frame: fitted back on the unshaped run, the shaped
        # prediction is the stand-in's own figure
        assert case["fitted_frame_s"] == pytest.approx(FRAME_S, rel=0.05)
        assert case["ratio"] == pytest.approx(1.0, abs=0.02)
    assert work_of(measured["swarms"][0]) == WORK

    # given that measurement, no swarm runs and nothing is calibrated again: the prediction alone
    room = "swarm.bench.simulate.record_measure"
    with mock.patch(f"{room}.calibrate", _nothing_runs), mock.patch(f"{room}.swarm_run", _nothing_runs):
        again = run_record_setting(str(tmp_path / "again"), smoke=True,
                                   measured_path=str(tmp_path / "first" / "record_measured.json"))
    assert [c["predicted"] for c in again["cases"]] == [c["predicted"] for c in result["cases"]]


@pytest.mark.e2e
def test_the_cli_predicts_from_a_measured_file(tmp_path):
    _first_run(tmp_path / "first")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "swarm.cli", "bench", "simulate", "--record-setting", "--smoke",
                    "--measured", str(tmp_path / "first" / "record_measured.json"), "--out", str(tmp_path / "again")],
                   check=True, env=env, cwd=tmp_path, timeout=300, capture_output=True)
    again = json.loads((tmp_path / "again" / "simulate_record.json").read_text())
    assert [c["variant"] for c in again["cases"]] == ["dense", "subspace"]
    assert (tmp_path / "again" / "simulate_record.png").stat().st_size > 10_000


def test_a_peer_s_ordered_frames_leave_one_at_a_time_so_the_first_arrives_alone():
    nbytes, mbit, latency = 1_000_000, 80.0, 0.05
    alone = Packets().on_line(nbytes) * 8 / (mbit * 1e6)  # one frame's time on the uplink

    async def arrivals(ordered: bool) -> list[float]:
        link = LinkDraw().link(mbit * 1e6, latency, asyncio.get_running_loop().time)
        line, ends = SendLine(), []

        async def one() -> None:
            await (line.send(link, nbytes) if ordered else link.send(nbytes))
            ends.append(now())
        await asyncio.gather(one(), one())
        return ends

    # in turn: the first after its own time, the second right behind it (the latency of both overlaps)
    assert run_virtual(arrivals(True)) == pytest.approx([alone + latency, 2 * alone + latency], rel=1e-3)
    # sharing the uplink: both after twice the time (swarm peer --send-order shared)
    assert run_virtual(arrivals(False)) == pytest.approx([2 * alone + latency] * 2, rel=1e-3)

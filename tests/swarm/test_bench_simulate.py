"""`swarm bench simulate`: the virtual-clock engine, the link and compute models, that the simulated
swarm routes with the project's own Router, the item-1 schedule, churn, and the bench's smoke run."""
from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch

from protocol.model import StageModule, spec_basis
from protocol.spec import preset
from swarm.bench.hardware.mfu import matmul_weights
from swarm.bench.simulate.engine import SharedCores, SimulationStuck, Worker, now, run_virtual
from swarm.bench.simulate.hardware import GPUS, LinkDraw, gpu, stage_flops, wire_bytes
from swarm.bench.simulate.peers import SimSwarm, SwarmConfig
from swarm.bench.simulate.run import SimSetup, auto_microbatches, one_gpu_tokens_per_second, simulate
from swarm.bench.simulate.step import StepDriverModel, StepOptions, _shares
from swarm.net.home_link import Packets
from swarm.replicas.router import Router

ROOT = Path(__file__).resolve().parents[2]


def test_the_virtual_clock_jumps_an_hour_in_no_time_and_a_deadlock_is_an_error():
    async def hour() -> float:
        await asyncio.sleep(3600.0)
        return now()

    t0 = time.perf_counter()
    assert run_virtual(hour()) == pytest.approx(3600.0)
    assert time.perf_counter() - t0 < 1.0

    async def stuck() -> None:
        await asyncio.get_running_loop().create_future()  # nobody resolves it

    with pytest.raises(SimulationStuck):
        run_virtual(stuck())


@pytest.mark.parametrize("nbytes,mbit,latency", [(1_000_000, 10.0, 0.05), (250_000, 80.0, 0.12)])
def test_one_transfer_takes_its_bytes_over_the_rate_plus_the_latency(nbytes, mbit, latency):
    line = Packets().on_line(nbytes)  # the shaper counts IP packets (headers), as on a real line

    async def main() -> float:
        link = LinkDraw().link(mbit * 1e6, latency, asyncio.get_running_loop().time)
        t0 = now()
        await link.send(nbytes)
        return now() - t0

    assert run_virtual(main()) == pytest.approx(line * 8 / (mbit * 1e6) + latency, rel=1e-6)


def test_two_sends_from_one_host_queue_on_its_uplink():
    nbytes, rate, latency = 500_000, 20e6, 0.03
    line = Packets().on_line(nbytes)

    async def main() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        a = LinkDraw().link(rate, latency, loop.time)
        t0 = now()
        ends = []

        async def send(link) -> None:
            await link.send(nbytes)
            ends.append(now() - t0)

        await asyncio.gather(send(a), send(a))  # one host, two frames: they share its uplink
        t1 = now()
        b, c = (LinkDraw().link(rate, latency, loop.time) for _ in range(2))  # made now: no burst earned yet
        await asyncio.gather(send(b), send(c))  # two hosts: each has its own uplink
        return ends[0], ends[1], now() - t1

    first, second, apart = run_virtual(main())
    alone = line * 8 / rate
    assert second == pytest.approx(2 * alone + latency, rel=1e-3)
    assert first >= alone + latency - 1e-9
    assert apart == pytest.approx(alone + latency, rel=1e-3)


def test_a_worker_runs_jobs_in_order_and_shared_cores_slow_each_other():
    async def main() -> tuple[float, float]:
        w = Worker()
        await asyncio.gather(w.run(1.0), w.run(2.0))
        t = now()
        cores = SharedCores(2)
        await asyncio.gather(*(Worker(cores).run(1.0) for _ in range(3)))  # 3 jobs on 2 cores
        return t, now() - t

    one_after_other, shared = run_virtual(main())
    assert one_after_other == pytest.approx(3.0)
    assert shared == pytest.approx(1.5)


def test_stage_flops_follow_six_n_plus_attention_and_the_gpu_table():
    spec = preset("small")
    work = stage_flops(spec)
    tokens = spec.microbatch_size * spec.seq_len
    basis = spec_basis(spec)
    for s in range(spec.n_stages):
        with torch.device("meta"):
            n = matmul_weights([StageModule(spec, s, basis)])  # the mfu bench's count, on a built stage
        attention = 4 * spec.stage_layers[s] * spec.seq_len * spec.d_model
        assert work.forward[s] == pytest.approx(tokens * (2 * n + attention), rel=1e-9)
        assert work.backward[s] == 2 * work.forward[s]
    assert gpu("RTX 3090", 0.5).flops_per_second == pytest.approx(GPUS["RTX 3090"] * 0.5e12)
    large = preset("large")
    h100 = one_gpu_tokens_per_second(stage_flops(large), large, gpu("H100", 0.4).flops_per_second)
    # 6 N + 12 L T d per token, N ~ 16 (4 d^2 + 3 d d_ff) + d V: ~5.3 GFLOP, on 0.4 x 989 TFLOP/s
    assert 6e4 < h100 < 9e4


def test_message_sizes_come_from_the_real_encoder():
    dense, sub = wire_bytes(preset("small", codec="dense")), wire_bytes(preset("small", codec="subspace"))
    spec = preset("small")
    tokens = spec.microbatch_size * spec.seq_len
    assert dense.activation == pytest.approx(tokens * spec.d_model * 2, rel=0.01)  # bf16 wire
    assert sub.activation == pytest.approx(tokens * spec.rank * 2 + spec.microbatch_size * (spec.seq_len + 1),
                                           rel=0.02)
    power = wire_bytes(preset("small", replica_sync="powersgd", replica_sync_rank=8))
    assert len(power.sync_rounds[0]) == 2 and len(sub.sync_rounds[0]) == 1
    assert sum(power.sync_rounds[0]) < sub.sync_rounds[0][0] / 20
    # rank 32: r (n + m) numbers a factored matrix, 4x r = 8's, and still a tenth of the exact sum
    r32 = sum(wire_bytes(preset("small", replica_sync="powersgd", replica_sync_rank=32)).sync_rounds[0])
    assert 3 * sum(power.sync_rounds[0]) < r32 < sub.sync_rounds[0][0] / 10


def _swarm(n: int, codec: str = "subspace", lifetime_s: float = math.inf, seed: int = 0) -> tuple:
    spec = preset("small", codec=codec)
    cfg = SwarmConfig(spec, stage_flops(spec), [("RTX 3090", gpu("RTX 3090", 0.4).flops_per_second)],
                      LinkDraw((80, 80), (20, 20)), wire_bytes(spec).state, lifetime_s=lifetime_s, seed=seed)
    return spec, cfg


def test_the_simulator_routes_with_the_real_router_and_avoids_a_dead_replica():
    spec, cfg = _swarm(6)

    async def main():
        swarm = SimSwarm(cfg)
        await swarm.populate(6)
        assert all(type(p.router) is Router for p in swarm.peers.values())
        assert [len(swarm.live(s)) for s in range(3)] == [2, 2, 2]  # placement.emptiest, one after another
        dead = swarm.live(1)[0]
        swarm._die(dead)  # its DHT record lives on until its ttl: routers still see it
        driver = StepDriverModel(swarm, StepOptions(8), wire_bytes(spec))
        with mock.patch.object(Router, "pick", autospec=True, side_effect=Router.pick) as pick:
            await driver.run(steps=3)
        return swarm, driver, dead, pick.call_count

    swarm, driver, dead, picks = run_virtual(main())
    assert driver.step == 3 and picks >= 3 * 8 * 2
    assert dead.microbatches == 0
    leader = swarm.peers[swarm.order[0]]
    assert leader.router.is_banned(dead.peer_id)  # a send failed: the router banned it
    other = next(p for p in swarm.live(1) if p is not dead)
    assert other.microbatches == 8  # every microbatch of the last step went to the live replica


def test_today_only_the_leader_computes_stage_0_and_every_head_works_spreads_it():
    spec, cfg = _swarm(6)
    for every, expect in ((False, {8, 0}), (True, {4})):
        async def main(every=every):
            swarm = SimSwarm(cfg)
            await swarm.populate(6)
            await StepDriverModel(swarm, StepOptions(8, every_head_works=every), wire_bytes(spec)).run(steps=2)
            return [p.microbatches for p in swarm.live(0)]

        assert set(run_virtual(main())) == expect
    assert [n for _, n in _shares(10, [mock.Mock(rate=1.0), mock.Mock(rate=3.0)])] == [3, 7]


def _churn_setup(follow: str = "sums", replica_sync: str = "powersgd") -> dict:
    # powersgd: the bench's default, the replica sync a swarm on home links runs (with exact, 27 MB a step per
    # partner at 80 Mbit/s, a replacement's forwarded steps come no faster than the swarm makes them: it never
    # catches up, in the model as in the swarm); at rank 8, whose factor sums are the 0.6 MB these tests name
    spec = preset("small", replica_sync=replica_sync, replica_sync_rank=8)
    cards = [("RTX 3090", gpu("RTX 3090", 0.4).flops_per_second)]
    return dict(spec=spec, work=stage_flops(spec), wire=wire_bytes(spec, follow), gpus=cards,
                links=LinkDraw((80, 80)), peers=6, microbatches=auto_microbatches(spec, 6, 2), steps=None,
                seconds=1800.0, rejoin_s=30.0)


def test_churn_kills_peers_replaces_them_and_redrives_steps():
    common = _churn_setup()
    calm = simulate(SimSetup(**common))
    churned = simulate(SimSetup(**common, lifetime_s=120.0))
    assert calm["deaths"] == 0 and calm["failed_attempts"] == 0
    assert churned["deaths"] > 5 and churned["failed_attempts"] > 0
    assert 0 < churned["tokens_per_second"] < calm["tokens_per_second"]
    # replacements joined (choose_stage) and came online; counted over the run, not who is up at its last instant
    # (at 2-minute lifetimes all six peers may be down at once: nobody then holds any state, the swarm stops)
    assert churned["online"] >= 3
    assert churned["downloads"] >= churned["deaths"] - 6  # every replacement downloaded its state, in chunks


def test_a_replacement_forwarded_sums_catches_up_and_one_forwarded_whole_gradients_falls_behind():
    """The simulated joiner is forwarded every step since its snapshot over its donor's uplink: the reduce's
    factor sums (0.6 MB at `small`) it catches up on; the stage's whole gradient (27 MB, 2.7 s at 80 Mbit/s,
    the code before 2026-12-01) it does not, and the swarm trains at a fraction of the rate."""
    sums = simulate(SimSetup(**_churn_setup("sums"), lifetime_s=120.0))
    whole = simulate(SimSetup(**_churn_setup("whole"), lifetime_s=120.0))
    assert whole["tokens_per_second"] < 0.5 * sums["tokens_per_second"], (whole, sums)
    # one that falls more than 64 steps behind downloads again (who is up at the run's last instant is chance)
    assert whole["downloads"] / whole["deaths"] > sums["downloads"] / sums["deaths"]
    r8 = preset("small", replica_sync="powersgd", replica_sync_rank=8)
    assert wire_bytes(r8, "whole").follow[1] > 20 * wire_bytes(r8).follow[1]


@pytest.mark.e2e
def test_smoke_run_writes_json_and_png(tmp_path):
    # how long it takes is not asserted: a loaded 2-core machine is no clock (the guide: no timed tests)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "swarm.cli", "bench", "simulate", "--smoke", "--every-head-works",
                    "--out", str(tmp_path)], check=True, env=env, cwd=tmp_path, timeout=120, capture_output=True)
    result = json.loads((tmp_path / "simulate.json").read_text())
    assert (tmp_path / "simulate.png").stat().st_size > 10_000
    assert {r["codec"] for r in result["runs"]} == {"dense", "subspace"}
    assert {r["every_head_works"] for r in result["runs"]} == {False, True}
    sub = [r for r in result["runs"] if r["codec"] == "subspace" and not r["every_head_works"]]
    dense = [r for r in result["runs"] if r["codec"] == "dense" and not r["every_head_works"]]
    assert all(s["tokens_per_second"] > d["tokens_per_second"] > 0 for s, d in zip(sub, dense))
    assert result["churn"] and result["matches"] and result["one_gpu_tokens_per_second"]["H100"] > 0


def test_the_validation_calibrates_on_the_real_stage_runners_and_simulates_this_machine():
    from swarm.bench.simulate.validate import Case, calibrate, simulated
    spec = preset("tiny", codec="dense")
    work = calibrate(spec, threads=1, repeats=1)
    assert all(t > 0 for t in work.forward) and all(t > 0 for t in work.apply)
    assert work.backward[-1] == 0 and all(t > 0 for t in work.backward[:-1])  # the tail's backward is in its forward
    slow = simulated(spec, work, Case("dense", 1, "2mbit", "20ms"), steps=4, cores=2)
    fast = simulated(spec, work, Case("dense", 1, "unlimited", "0"), steps=4, cores=2)
    assert 0 < slow["tokens_per_second"] < fast["tokens_per_second"]
    # the transport's own delay per frame (measured when validating): 2 microbatches x 4 hops in a row each
    framed = simulated(spec, work, Case("dense", 1, "unlimited", "0"), steps=4, cores=2, frame_s=0.05)
    assert framed["median_step_s"] >= fast["median_step_s"] + 4 * 0.05
    # at 2 Mbit/s a dense tiny activation or gradient (262 KB) takes ~1 s a hop, and a microbatch makes 4 hops
    assert slow["median_step_s"] > 4 * 262_000 * 8 / 2e6


def test_the_swarm_s_cost_per_frame_is_fitted_so_the_unshaped_step_matches_the_real_one():
    from swarm.bench.simulate.hardware import StageWork
    from swarm.bench.simulate.validate import Case, fitted_frame_s, simulated
    spec = preset("tiny", codec="subspace")
    work = StageWork((0.004, 0.004, 0.006), (0.004, 0.004, 0.0), (0.002, 0.002, 0.002))
    case = Case("subspace", 1, "20mbit", "20ms")
    bare = Case("subspace", 1, "unlimited", "0")
    for truth in (0.003, 0.012):  # a "real" step made by a known per-frame cost is fitted back to that cost
        real = simulated(spec, work, bare, steps=6, cores=2, frame_s=truth)["median_step_s"]
        fitted = fitted_frame_s(spec, work, case, 6, 2, real)
        assert fitted == pytest.approx(truth, rel=0.05)
    # a real swarm faster than the model with no cost at all: no negative cost
    assert fitted_frame_s(spec, work, case, 6, 2, 1e-4) == 0.0
    # the fit is made without links and then costs the shaped case more than the plain model does
    shaped = simulated(spec, work, case, steps=6, cores=2)["median_step_s"]
    assert simulated(spec, work, case, steps=6, cores=2, frame_s=0.012)["median_step_s"] > shaped


def test_a_ring_reduce_sends_a_replica_a_fraction_of_the_all_to_all_bytes_and_pays_latency_per_hop():
    spec = preset("small", replica_sync="powersgd", replica_sync_rank=32)
    wire = wire_bytes(spec)
    cards = [("RTX 3090", gpu("RTX 3090", 0.4).flops_per_second)]

    def commit(reduce: str, peers: int) -> float:
        setup = SimSetup(spec, stage_flops(spec), wire, cards, LinkDraw((80, 80), (20, 20)), peers,
                         auto_microbatches(spec, peers, 2), steps=3, reduce=reduce)
        return simulate(setup)["median_commit_s"]

    n = 8  # replicas a stage: 24 peers over small's 3 stages
    everyone, ring = commit("all", 3 * n), commit("ring", 3 * n)
    biggest = max(sum(r) for r in wire.sync_rounds)
    assert everyone >= (n - 1) * biggest * 8 / 80e6  # every other replica gets the whole contribution
    assert ring < everyone / 2
    assert ring >= len(wire.sync_rounds[0]) * 2 * (n - 1) * 0.020  # 2 (n - 1) hops of 20 ms a round, in a row
    assert commit("ring", 6) == commit("all", 6)  # two replicas a stage: a ring is the pair's exchange


def test_a_window_of_microbatches_in_flight_serialises_the_pipeline_as_the_real_head_does():
    def phase(window: int) -> float:
        spec = preset("small", microbatches_in_flight=window)
        cfg = SwarmConfig(spec, stage_flops(spec), [("RTX 3090", gpu("RTX 3090", 0.4).flops_per_second)],
                          LinkDraw((80, 80), (20, 20)), wire_bytes(spec).state)

        async def main():
            swarm = SimSwarm(cfg)
            await swarm.populate(3)
            driver = StepDriverModel(swarm, StepOptions(8), wire_bytes(spec))
            await driver.run(steps=2)
            return driver.records[-1].microbatch_s
        return run_virtual(main())

    every, one, wide = phase(0), phase(1), phase(8)
    assert wide == every  # a window of the whole step is no window
    assert one > 2 * every  # one at a time: no two microbatches ever overlap in the pipeline

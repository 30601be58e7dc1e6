"""`swarm bench simulate`: a discrete-event simulation of a swarm of N home GPUs (10 to 1,000)
that runs the project's own router and placement against modelled compute and home links.

The engine (`engine.py`) is asyncio on a virtual clock; the peers' GPUs, links and the
bytes of a step come from `hardware.py` (a table of consumer GPUs with sources, each
stage's FLOPs from the spec, message sizes from the real encoders); `peers.py` holds the
peers, their directory and churn; `step.py` is the step as the driver runs it;
`run.py` runs one swarm. This file sweeps:

1. tokens/s against N for each codec, on links of `--uplink` Mbit/s (80 by default) and a
   one-way latency drawn from `--latency` ms, the step's batch growing with the swarm
   (`--microbatches-per-replica` per replica of a stage);
2. goodput against the mean peer lifetime (exponential lifetimes, a replacement `--rejoin-s`
   later) at `--churn-peers` peers over `--churn-minutes` of virtual time, for each of `--follow`'s
   models of what a replacement's donor forwards it while it catches up ("sums": the reduce's
   factor sums, as the swarm does; "whole": the stage's whole gradient, as it did before 2026-12-01);

each with the old schedule (only the leading head computes stage 0) and, with
`--every-head-works`, with issue 22 item 1's (modelled before it was built; the swarm now runs it:
peer/commit/head_work.py). Beside them, the one-GPU rate
of an A100 and an H100 at the same MFU, and per codec the smallest N that matches each.
Writes simulate.json and simulate.png.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from protocol.spec import preset
from swarm.bench.common.machine import machine_info

from .hardware import CONSUMER, DATACENTER, LinkDraw, gpu, stage_flops, wire_bytes
from .report import matches, plot
from .run import SimSetup, auto_microbatches, one_gpu_tokens_per_second, simulate


def parse_range(text: str, what: str) -> tuple[float, float]:
    """"80" -> (80, 80); "10-200" -> (10, 200)."""
    try:
        lo, _, hi = text.partition("-")
        pair = (float(lo), float(hi or lo))
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number or a range such as 10-200.") from None
    if pair[0] < 0 or pair[1] < pair[0]:
        raise ValueError(f"{what} {text!r} must be a non-negative number or a range low-high.")
    return pair


def run_simulate_bench(out_dir: str, preset_name: str = "large", codecs: tuple[str, ...] = ("dense", "subspace",
                       "bottleneck"), peers: tuple[int, ...] = (10, 30, 100, 300, 1000), uplink: str = "80",
                       latency: str = "10-150", downlink_ratio: float = 1.0, gpus: tuple[str, ...] = CONSUMER,
                       mfu: float = 0.4, replica_sync: str = "powersgd", per_replica: int = 4, steps: int = 8,
                       lifetimes: tuple[float, ...] = (math.inf, 240, 60, 30, 15), churn_peers: int = 100,
                       churn_minutes: float = 120.0, rejoin_s: float = 60.0, every_head_works: bool = False,
                       seed: int = 0, step_timeout: float | None = None, follows: tuple[str, ...] = ("sums",),
                       sync_rank: int | None = None, reduce: str = "all", smoke: bool = False) -> dict:
    if smoke:
        preset_name, codecs, peers, steps = "small", ("dense", "subspace"), (6, 12), 4
        lifetimes, churn_peers, churn_minutes = (math.inf, 2.0), 6, 5.0
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    links = LinkDraw(parse_range(uplink, "--uplink"), parse_range(latency, "--latency"), downlink_ratio)
    cards = [(name, gpu(name, mfu).flops_per_second) for name in gpus]
    modes = (False, True) if every_head_works else (False,)
    rows, churn, reference = [], [], {}
    for codec in codecs:
        spec = preset(preset_name, codec=codec, replica_sync=replica_sync, replica_sync_rank=sync_rank)
        work, wire = stage_flops(spec), wire_bytes(spec)
        reference = {name: one_gpu_tokens_per_second(work, spec, gpu(name, mfu).flops_per_second)
                     for name in DATACENTER}
        for ehw in modes:
            for n in peers:
                setup = SimSetup(spec, work, wire, cards, links, n, auto_microbatches(spec, n, per_replica), ehw,
                                 steps=steps, seed=seed, first_timeout=step_timeout, reduce=reduce)
                rows.append(_say(simulate(setup)))
        if codec != ("subspace" if "subspace" in codecs else codecs[0]):
            continue  # churn: the subspace codec's swarm (the first codec's if subspace is not run)
        for follow in follows:
            forwarded = wire_bytes(spec, follow)
            for ehw in modes:
                for life in lifetimes:
                    setup = SimSetup(spec, work, forwarded, cards, links, churn_peers,
                                     auto_microbatches(spec, churn_peers, per_replica), ehw, lifetime_s=life * 60,
                                     rejoin_s=rejoin_s, steps=None, seconds=churn_minutes * 60, seed=seed,
                                     first_timeout=step_timeout, reduce=reduce)
                    churn.append(_say({**simulate(setup), "follow": follow}))
    result = {"preset": preset_name, "device": "simulated", "devices": ["cpu"], "machine": machine_info(["cpu"]),
              "model": {"gpus": {name: {"tflops_bf16": round(rate / mfu / 1e12, 1)} for name, rate in cards},
                        "mfu": mfu, "uplink_mbit": links.uplink_mbit, "latency_ms": links.latency_ms,
                        "downlink_ratio": downlink_ratio, "replica_sync": replica_sync,
                        "replica_sync_rank": spec.replica_sync_rank, "reduce": reduce,
                        "microbatches_per_replica": per_replica, "rejoin_s": rejoin_s,
                        "churn_peers": churn_peers, "churn_minutes": churn_minutes, "step_timeout": step_timeout,
                        "follows": list(follows),
                        "lifetime": "exponential, mean lifetime_min"},
              "one_gpu_tokens_per_second": reference, "runs": rows, "churn": churn,
              "matches": matches(rows, reference)}
    (out / "simulate.json").write_text(json.dumps(result, indent=1, default=_finite) + "\n")
    plot(result, out / "simulate.png")
    return result


def _finite(x):
    return None if isinstance(x, float) and math.isinf(x) else x


def _say(row: dict) -> dict:
    life = "no churn" if row["lifetime_min"] is None else f"lifetime {row['lifetime_min']:g} min"
    print(f"{row['codec']:10s} N={row['peers']:5d} {'every head' if row['every_head_works'] else 'leader only'}, "
          f"{life}: {row['tokens_per_second']:10.0f} tok/s ({row['steps']} steps, {row['failed_attempts']} re-driven, "
          f"{row['wall_s']:.1f} s)")
    return row

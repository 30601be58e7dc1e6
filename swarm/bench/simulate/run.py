"""One simulated swarm: build it, drive it on the virtual clock, and sum up what it did.

`SimSetup` is everything one run needs; `simulate(setup)` returns a row for the bench's JSON:

    tokens_per_second  net tokens of the steps after the first (warm-up) over the virtual time
                       they took: steps undone by a rollback do not count (goodput under churn)
    steps, attempts    committed steps; attempts that failed and were re-driven
    rollbacks, lost_steps, deaths, restores, downloads
    online             replacements that came online (downloaded and caught up)
    gpu_busy           mean share of the run each live GPU computed
    wall_s             real seconds the simulation took

The one-GPU comparison (`one_gpu_tokens_per_second`): the whole model on one card in one
process, no network: tokens/s = R mfu / F with F = sum of every stage's forward and backward
FLOPs per token (hardware.py), the figure a datacenter run of one A100 or H100 is
measured against.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from peer.daemon.transfer_time import TransferWait, step_boundary_bytes
from protocol.spec import RunSpec

from .engine import SharedCores, now, run_virtual
from .hardware import LinkDraw, StageWork, WireBytes, tokens_per_microbatch
from .overlap import OverlapDriverModel
from .peers import SimSwarm, SwarmConfig
from .step import StepDriverModel, StepOptions


@dataclass
class SimSetup:
    spec: RunSpec
    work: StageWork
    wire: WireBytes
    gpus: list[tuple[str, float]]  # (name, sustained FLOP/s)
    links: LinkDraw
    peers: int
    microbatches: int
    every_head_works: bool = False
    lifetime_s: float = math.inf
    rejoin_s: float = 60.0
    steps: int | None = 10
    seconds: float | None = None
    seed: int = 0
    cores: SharedCores | None = None  # every peer on this machine's cores (validation), else a GPU each
    first_timeout: float | None = 120.0  # the first step's timeout (`swarm peer --step-timeout`; None: none)
    frame_s: float = 0.0  # the transport's own delay added to every frame (validation: measured), else none
    reduce: str = "all"  # step.REDUCES: how a stage's replicas exchange their contributions
    max_seconds: float = 7 * 86400.0  # virtual time after which a run that cannot finish its steps stops
    schedule: str = "sync"  # "overlap": two steps in flight on one-step-stale weights (overlap.py), no churn


def auto_microbatches(spec: RunSpec, peers: int, per_replica: int) -> int:
    """The step's microbatches: the spec's, or `per_replica` per replica of a stage if that is more
    (a data-parallel run's batch grows with its workers)."""
    return max(spec.n_microbatches, per_replica * math.ceil(peers / spec.n_stages))


def simulate(setup: SimSetup) -> dict:
    """Run one swarm (module docstring)."""
    t_wall = time.perf_counter()
    quiet = [logging.getLogger(n) for n in ("swarm.replicas.router", "swarm.replicas.placement")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.ERROR)  # every ban of a dead peer would be a warning
    try:
        row = run_virtual(_run(setup))
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
    row["wall_s"] = time.perf_counter() - t_wall
    return row


async def _run(setup: SimSetup) -> dict:
    cfg = SwarmConfig(setup.spec, setup.work, setup.gpus, setup.links, setup.wire.state, setup.lifetime_s,
                      setup.wire.follow, setup.wire.follow_alone, setup.rejoin_s, seed=setup.seed, cores=setup.cores,
                      frame_s=setup.frame_s)
    swarm = SimSwarm(cfg)
    await swarm.populate(setup.peers)
    # the first step's deadline grows with its boundary bytes, as a head's does (peer/step/driver.py)
    first = None if setup.first_timeout is None else TransferWait(
        setup.first_timeout, setup.spec.slowest_uplink_bps).seconds(step_boundary_bytes(setup.spec, setup.microbatches))
    opts = StepOptions(setup.microbatches, setup.every_head_works, first_timeout=first, reduce=setup.reduce)
    driver = (OverlapDriverModel if setup.schedule == "overlap" else StepDriverModel)(swarm, opts, setup.wire)
    await driver.run(setup.steps, setup.seconds if setup.seconds is not None else setup.max_seconds)
    end = now()
    recs = driver.records
    step_tokens = setup.microbatches * tokens_per_microbatch(setup.spec)
    if len(recs) >= 2:
        t0 = recs[0].end
        net_steps = driver.step - 1  # the first step is warm-up
        tps = max(0, net_steps) * step_tokens / max((end if setup.seconds else recs[-1].end) - t0, 1e-9)
    else:
        tps = 0.0
    live = [p for p in swarm.peers.values() if p.alive and p.ready]
    busy = [p.worker.busy_s / max(end - p.joined, 1e-9) for p in live]
    return {"peers": setup.peers, "stages": setup.spec.n_stages, "codec": setup.spec.codec,
            "replica_sync": setup.spec.replica_sync, "every_head_works": setup.every_head_works,
            "microbatches": setup.microbatches, "step_tokens": step_tokens,
            "lifetime_min": None if math.isinf(setup.lifetime_s) else setup.lifetime_s / 60,
            "tokens_per_second": tps, "steps": driver.step, "committed": len(recs),
            "failed_attempts": driver.failed_attempts,
            "failures": driver.failures, "rollbacks": driver.rollbacks, "lost_steps": driver.lost_steps,
            "deaths": swarm.deaths, "restores": swarm.restores, "downloads": swarm.downloads,
            "online": swarm.online, "virtual_s": end,
            "median_step_s": _median([b.end - a.end for a, b in zip(recs, recs[1:])]),
            "median_microbatch_s": _median([r.microbatch_s for r in recs[1:]]),
            "median_commit_s": _median([r.commit_s for r in recs[1:]]),
            "replicas_per_stage": [len(swarm.live(s)) for s in range(setup.spec.n_stages)],
            "gpu_busy": sum(busy) / len(busy) if busy else 0.0}


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def one_gpu_tokens_per_second(work: StageWork, spec: RunSpec, flops_per_second: float) -> float:
    """The whole model on one card (module docstring)."""
    per_microbatch = sum(work.forward) + sum(work.backward)
    return tokens_per_microbatch(spec) * flops_per_second / per_microbatch

"""`swarm bench`: the benchmarks. Each writes JSON and a PNG into --out and reports ratios
measured side by side in one run.

- `codecs.py`: bytes per token and encode/decode time per codec and width.
- `throughput.py`: tokens/s of whole local swarms per codec, unlimited vs a limited link.
- `convergence.py`: held-out loss against tokens, fixed U vs re-fitted U vs dense, and held-out
  loss against wall-clock time from measured tokens/s.
- `mfu.py`: the device's bf16 matmul rate and the share of it that training the whole model uses.
- `replicas.py`: tokens/s with 1, 2, 3 replicas per stage; seconds from a replica's death to the next step.
- `fidelity.py`: held-out loss against compression, one-cause ablations of the loss gap, dense vs
  subspace across widths; jobs spread over GPUs inside a time budget (docs/fidelity.md);
  `learned_boundary.py`: its diagnostic of learned per-stage projections (free stages, one process).
  `rvq_boundary.py`: its diagnostic of the hybrid's lossy numbers sent as residual-VQ codes (one process).
- `replica_sync.py` (+ `sync_bytes.py`): per replica-sync mode, bytes per replica per step (small, large),
  tokens/s with 2 replicas per stage on shaped links, held-out loss at equal tokens.
- `verify.py`: what spot checks of replicas' work cost: tokens/s and input bytes per step at rates 0, 1/16, 1.
- `share_tolerance.py`: how far honest computations of a replica's share fall apart (other kernels,
  the CPU, fp32) against what lies score: the measurement behind spot checks' tolerance.
- `churn.py` (+ `churn_report.py`): peers in network namespaces killed and replaced all the time:
  goodput, gaps, lost/doubled steps, resets, rollbacks, replica agreement, failover.
- `record.py`: the public slow-link record's setting (d=1024, 8 stages, 200 Mbit/s, 50 ms): time to
  dense's final loss per codec, from convergence's curves and throughput's swarms (`record_variants.py`:
  what it trains, by name).
- `simulate.py` (+ `simulate_engine.py`, `simulate_hardware.py`, `simulate_swarm.py`, `simulate_step.py`,
  `simulate_run.py`, `simulate_report.py`, `simulate_validate.py`): a discrete-event simulation of 10-1,000
  home GPUs running the project's router and placement: tokens/s against N, churn and codec; `--validate`
  checks it against real local swarms.
- `transport.py`: MB/s of raw TCP, the libp2p daemons and our Transport on loopback, and the tokens/s
  that caps between two stages per preset and codec.
- `scale.py`: tokens/s against GPUs: layouts of stages x replicas (1x2: data parallel heads) vs one process.
- `memory.py`: each stage's peak GPU memory against `peer/runner/memory_estimate.py`, and the smallest card it fits.
- `cli.py`: each bench's flags (`swarm bench BENCH --help`; simulate's in `cli_simulate.py`, the shared ones in
  `cli_flags.py`); `machine.py`: the devices and machine every bench's JSON records, and the torch threads a
  bench trains on.
"""
from __future__ import annotations

import argparse
import signal
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_bench(a: argparse.Namespace) -> int:
    """Run one benchmark; SIGTERM stops it like Ctrl+C, through every `finally` (processes stopped,
    namespaces removed)."""
    from swarm.optional import require
    require("matplotlib", "swarm bench (its plots)")  # before a long run: the Docker image leaves it out
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        _dispatch(a)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"results written to {a.out}/")
    return 0


def _simulate(a: argparse.Namespace) -> None:
    if a.validate:
        from .simulate.validate import run_validation
        run_validation(a.out, smoke=a.smoke)
        return
    from .simulate.bench import run_simulate_bench
    run_simulate_bench(a.out, preset_name=a.preset, codecs=tuple(c.strip() for c in a.codecs.split(",")),
                       peers=a.peers, uplink=a.uplink, latency=a.latency, downlink_ratio=a.downlink_ratio,
                       gpus=tuple(g.strip() for g in a.gpus.split(",")), mfu=a.mfu, replica_sync=a.replica_sync,
                       per_replica=a.microbatches_per_replica, steps=a.steps, lifetimes=a.lifetimes,
                       churn_peers=a.churn_peers, churn_minutes=a.churn_minutes, rejoin_s=a.rejoin_s,
                       every_head_works=a.every_head_works, seed=a.seed, step_timeout=a.step_timeout or None,
                       follows=follow_models(a.follow), sync_rank=a.sync_rank, reduce=a.reduce, smoke=a.smoke)


def follow_models(text: str) -> tuple[str, ...]:
    models = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    if not models or any(m not in ("sums", "whole") for m in models):
        raise ValueError(f"--follow {text!r}: give sums, whole, or sums,whole.")
    return models


def _dispatch(a: argparse.Namespace) -> None:
    """Run the bench `a.which` with its flags (swarm/bench/cli.py gives each bench only its own)."""
    from .cli import resolve_bench_dtype
    resolve_bench_dtype(a)
    if a.which == "mfu":
        from .hardware.mfu import run_mfu_bench
        run_mfu_bench(a.out, preset_name=a.preset, codec=a.codec, dtype=a.dtype, device=a.device, steps=a.steps,
                      matmul_n=a.matmul_size, microbatch_size=a.microbatch_size, compile_blocks=a.compile,
                      smoke=a.smoke)
    elif a.which == "codecs":
        from .hardware.codecs import run_codecs_bench
        run_codecs_bench(a.out, smoke=a.smoke)
    elif a.which == "convergence":
        from .record.convergence import run_convergence_bench
        run_convergence_bench(a.out, preset_name=a.preset, steps=a.steps, data=a.data, device=a.device,
                              smoke=a.smoke, throughput_json=a.throughput_json, link=a.link,
                              curves_json=a.curves_json, dtype=a.dtype, stage_lr=a.constrained_stage_lr)
    elif a.which == "fidelity":
        import json

        from .fidelity.bench import run_fidelity_bench
        from .fidelity.plan import GROUPS
        groups = tuple(g.strip() for g in a.groups.split(",")) if a.groups else GROUPS
        run_fidelity_bench(a.out, plan=a.plan, device=a.device, parallel=a.parallel, per_device=a.per_device,
                           budget_s=a.budget_s, groups=groups, data=a.data, smoke=a.smoke,
                           best=json.loads(a.best) if a.best else None, resume=a.resume, dense_runs=a.dense_runs)
    elif a.which == "replica-sync":
        from .replicas.replica_sync import run_replica_sync_bench
        run_replica_sync_bench(a.out, preset_name=a.preset, steps=a.steps, ranks=a.sync_rank,
                               bandwidth=a.bandwidth, latency=a.latency, device=a.device, data=a.data,
                               seeds=a.seeds, lr=a.lr, smoke=a.smoke, warmups=a.sync_warmup)
    elif a.which == "transport":
        from .hardware.transport import run_transport_bench
        run_transport_bench(a.out, sizes_mb=a.sizes, megabytes=a.megabytes, repeats=a.repeats, dtype=a.dtype,
                            smoke=a.smoke)
    elif a.which == "verify":
        from .replicas.verify import run_verify_bench
        run_verify_bench(a.out, preset_name=a.preset, steps=a.steps, replicas=a.replicas, repeats=a.repeats,
                         device=a.device, data=a.data, bandwidth=a.bandwidth, latency=a.latency, stages=a.stages,
                         dtype=a.dtype, smoke=a.smoke)
    elif a.which == "share-tolerance":
        from .replicas.share_tolerance import run_share_tolerance_bench
        run_share_tolerance_bench(a.out, presets=tuple(x.strip() for x in a.presets.split(",")),
                                  codecs=tuple(x.strip() for x in a.codecs.split(",")), device=a.device,
                                  dtype=a.dtype, warm_steps=a.warm_steps, steps=a.steps, replicas=a.replicas,
                                  data=a.data, smoke=a.smoke)
    elif a.which == "churn":
        from .churn.bench import run_churn_bench
        run_churn_bench(a.out, preset_name=a.preset, hosts=a.hosts, replicas=a.replicas, period=a.period,
                        minutes=a.minutes, leader_every=a.leader_every, bandwidth=a.bandwidth,
                        baseline_minutes=a.baseline_minutes, seed=a.seed, checkpoint_every=a.checkpoint_every,
                        peer_args=a.peer_args, coordinator_args=a.coordinator_args, device=a.device,
                        smoke=a.smoke)
    elif a.which == "memory":
        from .hardware.memory import run_memory_bench
        run_memory_bench(a.out, presets=a.presets.split(","), device=a.device, dtype=a.dtype, stages=a.stages,
                         options=a.checkpointing, caps=not a.no_caps, smoke=a.smoke)
    elif a.which == "record":
        from .record.bench import run_record_bench
        run_record_bench(a.out, tokens=a.tokens, data=a.data, device=a.device, devices=a.devices,
                         bandwidth=a.bandwidth, latency=a.latency, steps=a.steps, codec_tokens=a.codec_tokens,
                         resume=a.resume, parts=a.parts, smoke=a.smoke, variants=a.variants)
    elif a.which == "simulate":
        _simulate(a)
    elif a.which == "scale":
        from .hardware.scale import run_scale_bench
        run_scale_bench(a.out, preset_name=a.preset, layouts=a.layouts, codec=a.codec, dtype=a.dtype,
                        devices=a.devices, device=a.device, steps=a.steps, warmup=a.warmup, bandwidth=a.bandwidth,
                        latency=a.latency, replica_sync=a.replica_sync, baseline=not a.no_baseline, resume=a.resume,
                        limit_s=a.layout_limit, smoke=a.smoke, batch_size=a.batch_size,
                        in_flight=a.microbatches_in_flight, repeat=a.repeat)
    elif a.which == "replicas":
        from .replicas.bench import run_replicas_bench
        run_replicas_bench(a.out, preset_name=a.preset, steps=a.steps, device=a.device, smoke=a.smoke)
    else:
        from .record.throughput import run_throughput_bench
        run_throughput_bench(a.out, preset_name=a.preset, steps=a.steps, bandwidth=a.bandwidth,
                             latency=a.latency, device=a.device, smoke=a.smoke, devices=a.devices, dtype=a.dtype,
                             kernel_shaping=a.kernel_shaping, stages=a.stages, codecs=a.codecs,
                             send_orders=a.send_order)

"""`swarm bench codecs|mfu|memory|transport|scale`: each bench's subcommand (its flags in hardware/flags.py) and
what runs it; the bench module is imported only when it runs, so that `swarm --help` stays fast."""
from __future__ import annotations

import argparse

from swarm.bench.common.flags import Subcommand

from .flags import add_codecs, add_memory, add_mfu, add_scale, add_transport


def _codecs(a: argparse.Namespace) -> None:
    from .codecs import run_codecs_bench
    run_codecs_bench(a.out, smoke=a.smoke)


def _mfu(a: argparse.Namespace) -> None:
    from .mfu import run_mfu_bench
    run_mfu_bench(a.out, preset_name=a.preset, codec=a.codec, dtype=a.dtype, device=a.device, steps=a.steps,
                  matmul_n=a.matmul_size, microbatch_size=a.microbatch_size, compile_blocks=a.compile,
                  smoke=a.smoke)


def _memory(a: argparse.Namespace) -> None:
    from .memory import run_memory_bench
    run_memory_bench(a.out, presets=a.presets.split(","), device=a.device, dtype=a.dtype, stages=a.stages,
                     options=a.checkpointing, caps=not a.no_caps, smoke=a.smoke, vocab=a.vocab)


def _transport(a: argparse.Namespace) -> None:
    from .transport import run_transport_bench
    run_transport_bench(a.out, sizes_mb=a.sizes, megabytes=a.megabytes, repeats=a.repeats, dtype=a.dtype,
                        smoke=a.smoke)


def _scale(a: argparse.Namespace) -> None:
    from .scale import run_scale_bench
    run_scale_bench(a.out, preset_name=a.preset, layouts=a.layouts, codec=a.codec, dtype=a.dtype,
                    devices=a.devices, device=a.device, steps=a.steps, warmup=a.warmup, bandwidth=a.bandwidth,
                    latency=a.latency, replica_sync=a.replica_sync, baseline=not a.no_baseline, resume=a.resume,
                    limit_s=a.layout_limit, smoke=a.smoke, batch_size=a.batch_size,
                    in_flight=a.microbatches_in_flight, repeat=a.repeat)


# the room's benches by name (swarm/bench/cli.py registers them)
BENCHES: dict[str, Subcommand] = {
    "codecs": Subcommand(add_codecs, _codecs),
    "mfu": Subcommand(add_mfu, _mfu),
    "memory": Subcommand(add_memory, _memory),
    "transport": Subcommand(add_transport, _transport),
    "scale": Subcommand(add_scale, _scale),
}

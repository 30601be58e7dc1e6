"""`swarm bench`: dispatches to the benchmarks; each writes JSON and a PNG into --out."""
from __future__ import annotations

import argparse


def run_bench(a: argparse.Namespace) -> int:
    if a.which == "codecs":
        from .bench_codecs import run_codecs_bench
        run_codecs_bench(a.out, smoke=a.smoke)
    elif a.which == "convergence":
        from .bench_convergence import run_convergence_bench
        run_convergence_bench(a.out, preset_name=a.preset, steps=a.steps or 2000,
                              data=a.data, device=a.device, smoke=a.smoke)
    else:
        from .bench_throughput import run_throughput_bench
        run_throughput_bench(a.out, preset_name=a.preset, steps=a.steps or 20, bandwidth=a.bandwidth, latency=a.latency,
                             device=a.device, smoke=a.smoke)
    print(f"results written to {a.out}/")
    return 0

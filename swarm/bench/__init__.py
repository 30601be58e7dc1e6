"""`swarm bench`: the benchmarks. Each writes JSON and a PNG into --out and reports ratios
measured side by side in one run.

- `codecs.py`: bytes per token and encode/decode time per codec and width.
- `throughput.py`: tokens/s of whole local swarms per codec, unlimited vs a limited link.
- `convergence.py`: held-out loss against tokens, fixed U vs re-fitted U vs dense.
- `replicas.py`: tokens/s with 1, 2, 3 replicas per stage, and seconds from a replica's death to the next step.
- `replica_sync.py` (+ `sync_bytes.py`): per replica-sync mode, bytes per replica per step (small, large),
  tokens/s with 2 replicas per stage on shaped links, held-out loss at equal tokens.
"""
from __future__ import annotations

import argparse


def run_bench(a: argparse.Namespace) -> int:
    if a.which == "codecs":
        from .codecs import run_codecs_bench
        run_codecs_bench(a.out, smoke=a.smoke)
    elif a.which == "convergence":
        from .convergence import run_convergence_bench
        run_convergence_bench(a.out, preset_name=a.preset, steps=a.steps or 2000,
                              data=a.data, device=a.device, smoke=a.smoke)
    elif a.which == "replica-sync":
        from .replica_sync import run_replica_sync_bench
        run_replica_sync_bench(a.out, preset_name=a.preset, steps=a.steps or 300, ranks=a.sync_rank,
                               bandwidth=a.bandwidth, latency=a.latency, device=a.device, data=a.data,
                               seeds=a.seeds, lr=a.lr, smoke=a.smoke)
    elif a.which == "replicas":
        from .replicas import run_replicas_bench
        run_replicas_bench(a.out, preset_name=a.preset, steps=a.steps or 20, device=a.device, smoke=a.smoke)
    else:
        from .throughput import run_throughput_bench
        run_throughput_bench(a.out, preset_name=a.preset, steps=a.steps or 20, bandwidth=a.bandwidth, latency=a.latency,
                             device=a.device, smoke=a.smoke)
    print(f"results written to {a.out}/")
    return 0

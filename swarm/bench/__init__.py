"""`swarm bench`: the benchmarks. Each writes JSON and a PNG into --out and reports ratios
measured side by side in one run. One room per question; each room's `cli.py` holds its benches'
flags and what runs them, and imports a bench only when it runs.

- `hardware/`: what one machine does: codecs' bytes and time, MFU, stage memory, the transport's
  MB/s, tokens/s against GPUs (`codecs`, `mfu`, `memory`, `transport`, `scale`).
- `record/`: tokens/s of local swarms per codec, held-out loss against tokens and time, and the
  public slow-link record's setting (`throughput`, `convergence`, `record`).
- `fidelity/`: held-out loss against compression, ablations of the gap, widths; its diagnostics
  (learned boundaries, RVQ) and fp16 against bf16 (`fidelity`).
- `replicas/`: what replicas cost and buy, replica-sync modes, spot checks' cost and tolerance
  (`replicas`, `replica-sync`, `verify`, `share-tolerance`).
- `churn/`: peers in network namespaces killed and replaced all the time (`churn`).
- `simulate/`: a discrete-event simulation of 10-1,000 home GPUs, and its check against real
  local swarms (`simulate`).
- `common/`: what every bench shares: the machine every JSON records, the shared flags.
- `cli.py`: the registry: each bench's subcommand, from the room that owns it (`swarm bench BENCH --help`).
- here: `run_bench`, which runs the bench chosen.

Rooms import `common` and, where they must, each other (fidelity and replicas use record;
simulate uses replicas); none imports this package's `__init__` or `cli.py`.
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

    from .common.flags import resolve_bench_dtype
    require("matplotlib", "swarm bench (its plots)")  # before a long run: the Docker image leaves it out
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        resolve_bench_dtype(a)
        a.run(a)  # set by the subcommand of the room that owns the bench (swarm/bench/cli.py)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"results written to {a.out}/")
    return 0

"""`swarm bench`: the registry of the benchmarks' subcommands. Each room (swarm/bench/ROOM/cli.py) holds its
benches' flags and what runs them; `register` adds them to the `swarm` parser, one subcommand per bench with only
the flags it uses (`swarm bench fidelity --help` lists fidelity's and nothing else), and `swarm/bench/__init__.py`
runs the one chosen."""
from __future__ import annotations

import argparse

from .churn import cli as churn
from .fidelity import cli as fidelity
from .hardware import cli as hardware
from .record import cli as record
from .replicas import cli as replicas
from .simulate import cli as simulate

# each bench and the room that owns it, in the order `swarm bench --help` lists them
OWNERS = {"codecs": hardware, "throughput": record, "convergence": record, "mfu": hardware, "replicas": replicas,
          "replica-sync": replicas, "verify": replicas, "share-tolerance": replicas, "fidelity": fidelity,
          "churn": churn, "memory": hardware, "record": record, "simulate": simulate, "transport": hardware,
          "scale": hardware}


def register(sub) -> argparse.ArgumentParser:
    """Add `bench` and its one subcommand per benchmark to the `swarm` subparsers `sub`; each subcommand sets
    `run`, what runs its bench."""
    from swarm.bench import run_bench
    be = sub.add_parser("bench", help="benchmarks: JSON + PNG, ratios measured side by side",
                        description="Benchmarks. Each writes JSON (with the devices and machine it ran on) and a "
                        "PNG into --out and measures the ratios it reports side by side in one run. "
                        "`swarm bench BENCH --help` lists a benchmark's flags.")
    benches = be.add_subparsers(dest="which", required=True, metavar="BENCH")
    for name, room in OWNERS.items():
        bench = room.BENCHES[name]
        bench.add(benches).set_defaults(run=bench.run)
    be.set_defaults(func=run_bench)
    return be

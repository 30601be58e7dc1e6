"""The gap groups of `swarm bench fidelity` without the CLI (whose parser imports the swarm's network side).
Usage: gap_run.py OUT PER_DEVICE BUDGET_S GROUPS"""
import sys

from swarm.bench.fidelity.bench import run_fidelity_bench

if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    run_fidelity_bench(sys.argv[1], plan="gpu", device="cuda", parallel=1, per_device=int(sys.argv[2]),
                       budget_s=float(sys.argv[3]), groups=tuple(sys.argv[4].split(",")), data="stdlib", resume=True)

"""`swarm bench fidelity`: its subcommand, its flags and what runs it; the bench module is imported only when it
runs, so that `swarm --help` stays fast."""
from __future__ import annotations

import argparse

from swarm.bench.common.flags import Subcommand, add_common, add_data


def _add_fidelity(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("fidelity", help="held-out loss against compression, ablations, widths",
                       description="Held-out loss against compression, one-cause ablations of the loss gap and "
                       "dense vs subspace across widths, as jobs spread over GPUs inside a time budget "
                       "(docs/fidelity.md); writes fidelity.json, fidelity.md and a PNG.")
    add_common(p)
    p.add_argument("--plan", choices=["gpu", "cpu"], default="gpu",
                   help="gpu (bf16, the small shape, ~10 min of 4 H100s) or cpu (d=128, the reduced size of the "
                   "CPU results) (default: gpu)")
    p.add_argument("--groups", help="comma-separated job groups: scale,headline,frontier,seeds,lr,optimizer,embed,"
                   "layers,refit,hybrid (default: these), and gap,gap-seed1 (why the constrained layers add nothing: "
                   "one boundary, full-width boundaries, lr of the constrained stages; seed 0 / seed 1)")
    p.add_argument("--parallel", type=int, default=1,
                   help="GPUs to use, cuda:0..N-1 (on a CPU: worker processes) (default: 1)")
    p.add_argument("--per-device", type=int, default=1, help="worker processes per GPU (default: 1)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="wall-clock budget in seconds; jobs that cannot finish are skipped or cut (default: 540)")
    p.add_argument("--resume", action="store_true",
                   help="keep the jobs OUT/fidelity.jsonl already holds finished and run the others (default: off)")
    p.add_argument("--best", metavar="JSON", help="RunSpec overrides for the headline's 'best settings' row, "
                   "e.g. '{\"lr\": 0.002}' (default: none)")
    p.add_argument("--dense-runs", type=_dense_runs, default=1, metavar="N",
                   help="train every dense job N times with the same spec: dense on a GPU is not bit-repeatable "
                   "(~1 point of held-out loss between identical runs), so every comparison with dense takes the "
                   "mean of the N runs (default: 1)")
    add_data(p)
    return p


def _dense_runs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"N must be a whole number of at least 1, not {text!r}.")
    return n


def _fidelity(a: argparse.Namespace) -> None:
    import json

    from .bench import run_fidelity_bench
    from .plan import GROUPS
    groups = tuple(g.strip() for g in a.groups.split(",")) if a.groups else GROUPS
    run_fidelity_bench(a.out, plan=a.plan, device=a.device, parallel=a.parallel, per_device=a.per_device,
                       budget_s=a.budget_s, groups=groups, data=a.data, smoke=a.smoke,
                       best=json.loads(a.best) if a.best else None, resume=a.resume, dense_runs=a.dense_runs)


# the room's benches by name (swarm/bench/cli.py registers them)
BENCHES: dict[str, Subcommand] = {"fidelity": Subcommand(_add_fidelity, _fidelity)}

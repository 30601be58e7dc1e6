"""Issue 24 item 2, the next round after docs/fidelity.md 3d-3e: levers tried on top of the best one found
(every parameter of the constrained stages at lr x0.03), at `small` (the gpu plan's 3-3-2 shape, d=512, k=32 =
16x, 1000 steps = 8.19M tokens), seeds 0 and 1, each seed a group with its own dense reference, all jobs sharing
one card. Usage: gap_levers.py OUT PER_DEVICE BUDGET_S"""
import sys

from swarm.bench.fidelity import bench as fidelity
from swarm.bench.fidelity.plan import _job, dense, plan_shape

LOW = {"constrained_stage_lr_scale": 0.03}
LEVERS = (  # name, spec changes on top of the plan's base
    ("constrained stages lr x0.03 (3d's best)", LOW),
    ("stages lr x0.02", {"constrained_stage_lr_scale": 0.02}),
    ("stages lr x0.05", {"constrained_stage_lr_scale": 0.05}),
    ("x0.03 + per-stage token tables", {**LOW, "embed_split": "per_stage"}),
    ("x0.03 + span(U) weights x0.25", {**LOW, "constrained_lr_scale": 0.25}),
    ("x0.03 + t_fixed_std 0.05", {**LOW, "t_fixed_std": 0.05}),
    ("x0.03 + global lr x0.7", {**LOW, "lr": None}),
)


def lever_jobs() -> list:
    s = plan_shape("gpu")
    out = []
    for seed in (0, 1):
        base = s.base.replace(total_steps=s.steps, seed=seed)
        group = f"levers-seed{seed}"
        out.append(_job("dense", group, dense(base), 0))
        for name, change in LEVERS:
            change = {k: (base.lr * 0.7 if k == "lr" else v) for k, v in change.items()}
            out.append(_job(name, group, base.replace(**change), 0, "16x"))
    return out


if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    jobs = lever_jobs()
    fidelity.jobs_for = lambda plan, groups, best=None: jobs
    fidelity.run_fidelity_bench(sys.argv[1], plan="gpu", device="cuda", parallel=1, per_device=int(sys.argv[2]),
                                budget_s=float(sys.argv[3]), groups=("levers-seed0", "levers-seed1"),
                                data="stdlib", resume=True)

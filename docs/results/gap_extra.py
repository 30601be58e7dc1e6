"""The gap groups (resumed) plus the best lever of section 3d (constrained stages at lr x0.03) at the
headline's length (2000 steps, seeds 0 and 1, each with its dense and default subspace references) and
at ~100x (k=5, seeds 0 and 1). Usage: gap_extra.py OUT PER_DEVICE BUDGET_S"""
import sys

from swarm.bench.fidelity import bench as fidelity
from swarm.bench.fidelity.plan import _job, dense, jobs_for, plan_shape

s = plan_shape("gpu")
LOW = {"constrained_stage_lr_scale": 0.03}


def extra_jobs() -> list:
    h = s.base.replace(total_steps=s.headline_steps, seed=1)
    out = [_job("dense", "headline-seed1", dense(h), 1),
           _job(f"subspace k={h.rank} fixed U", "headline-seed1", h, 1),
           _job("subspace k=d/16, constrained stages lr x0.03", "headline-seed1", h.replace(**LOW), 1)]
    for seed, group in ((0, "gap"), (1, "gap-seed1")):
        b = s.base.replace(total_steps=s.steps, seed=seed, rank=5)
        out.append(_job("k=5, constrained stages lr x0.03", group, b.replace(**LOW), 1, "~100x"))
    return out


if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    plan_jobs = jobs_for
    fidelity.jobs_for = lambda p, groups, best=None: plan_jobs(p, groups, best) + extra_jobs()
    fidelity.run_fidelity_bench(sys.argv[1], plan="gpu", device="cuda", parallel=1, per_device=int(sys.argv[2]),
                                budget_s=float(sys.argv[3]), groups=("headline", "gap", "gap-seed1", "gap-seed2"),
                                data="stdlib", best=LOW, resume=True)

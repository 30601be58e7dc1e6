"""Issue 24 item 2, "whether the gap shrinks with tokens": the best lever of docs/fidelity.md 3d (every parameter of
the constrained stages at lr x0.03) at 4x the plan's tokens (4000 steps = 32.8M tokens; 3d measured 1000 and 2000
steps), seeds 0 and 1 with their dense references, and the default subspace at seed 0; at 8x (8000 steps) seed 0
of dense and x0.03 only. `small` (the gpu plan's
3-3-2 shape, d=512, k=32 = 16x), all jobs sharing one card. Usage: gap_tokens.py OUT PER_DEVICE BUDGET_S STEPS"""
import sys

from swarm.bench.fidelity import bench as fidelity
from swarm.bench.fidelity.plan import _job, dense, plan_shape

LOW = {"constrained_stage_lr_scale": 0.03}
SEEDS = {8000: (0,)}  # 8x the tokens: one seed, dense and x0.03 only (what one 10-minute call holds)


def token_jobs(steps: int) -> list:
    s = plan_shape("gpu")
    out = []
    for seed in SEEDS.get(steps, (0, 1)):
        base = s.base.replace(total_steps=steps, seed=seed)
        group = f"tokens{steps}-seed{seed}"
        out += [_job("dense", group, dense(base), 0),
                _job("subspace, constrained stages lr x0.03", group, base.replace(**LOW), 0, "16x")]
        if seed == 0 and steps < 8000:
            out.append(_job(f"subspace k={base.rank} fixed U (default)", group, base, 0, "16x"))
    return out


if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    steps = int(sys.argv[4])
    jobs = token_jobs(steps)
    fidelity.jobs_for = lambda plan, groups, best=None: jobs
    fidelity.run_fidelity_bench(sys.argv[1], plan="gpu", device="cuda", parallel=1, per_device=int(sys.argv[2]),
                                budget_s=float(sys.argv[3]), groups=(f"tokens{steps}-seed0", f"tokens{steps}-seed1"),
                                data="stdlib", resume=True)

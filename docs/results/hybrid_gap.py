"""Issue 24 item 2, the hybrid: k exact subspace coordinates plus a b-wide trained bottleneck of what the
(then free) stages write outside span(U), at equal numbers per token (k + b = 32 = 16x of d=512) against the
subspace codec's best (k=32, stages before the last at lr x0.03) and dense, at `small` (the gpu plan's 3-3-2
shape), seeds 0 and 1, each seed a group with its own dense reference, all jobs sharing one card.
Usage: hybrid_gap.py OUT PER_DEVICE BUDGET_S [ROUND]: round 1 (the default) the split of the 32 numbers and the
stage lr at 1000 steps (8.19M tokens); round 2 the best of round 1 at 4x the tokens (4000 steps) beside dense,
and k=16 b=16 with the stage lr at 1000 steps; round 3 two neighbours of round 2's at 4000 steps (the stage lr
x0.02; k=28 b=4); round 4 the same at ~100x (5 numbers a token = 102x) at 1000 steps."""
import sys

from swarm.bench.fidelity import bench as fidelity
from swarm.bench.fidelity.plan import _job, dense, plan_shape

LOW = {"constrained_stage_lr_scale": 0.03}
ROUNDS = {  # round: (steps, [(name, spec changes on top of the plan's base: k=32, the published method)])
    1: (1000, (("subspace k=32, stages lr x0.03 (the default)", LOW),
               ("hybrid k=24 b=8", {"rank": 24, "residual_width": 8}),
               ("hybrid k=24 b=8, stages lr x0.03", {"rank": 24, "residual_width": 8, **LOW}),
               ("hybrid k=16 b=16", {"rank": 16, "residual_width": 16}),
               ("hybrid k=8 b=24", {"rank": 8, "residual_width": 24}))),
    2: (4000, (("hybrid k=24 b=8, stages lr x0.03", {"rank": 24, "residual_width": 8, **LOW}),)),
    3: (4000, (("hybrid k=24 b=8, stages lr x0.02",
                {"rank": 24, "residual_width": 8, "constrained_stage_lr_scale": 0.02}),
               ("hybrid k=28 b=4, stages lr x0.03", {"rank": 28, "residual_width": 4, **LOW}))),
    4: (1000, (("subspace k=5, stages lr x0.03 (the default)", {"rank": 5, **LOW}),
               ("hybrid k=4 b=1, stages lr x0.03", {"rank": 4, "residual_width": 1, **LOW}),
               ("hybrid k=3 b=2, stages lr x0.03", {"rank": 3, "residual_width": 2, **LOW}))),
}
EXTRA = {2: (1000, (("hybrid k=16 b=16, stages lr x0.03", {"rank": 16, "residual_width": 16, **LOW}),))}


def group(round_: int, steps: int, seed: int) -> str:
    if round_ == 1:
        return f"hybrid-seed{seed}"  # as first measured
    return f"hybrid{steps}-seed{seed}" + {3: "-r3", 4: "-100x"}.get(round_, "")


def hybrid_jobs(round_: int = 1) -> list:
    """Every group has its own dense reference at its steps."""
    s = plan_shape("gpu")
    out = []
    for steps, variants in (ROUNDS[round_], EXTRA.get(round_, (0, ()))):
        for seed in (0, 1) if variants else ():
            base, name = s.base.replace(total_steps=steps, seed=seed), group(round_, steps, seed)
            out += [_job("dense", name, dense(base), 0)]
            out += [_job(v, name, base.replace(**change), 0, "100x" if round_ == 4 else "16x")
                    for v, change in variants]
    return out


if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    round_ = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    jobs = hybrid_jobs(round_)
    fidelity.jobs_for = lambda plan, groups, best=None: jobs
    fidelity.run_fidelity_bench(sys.argv[1], plan="gpu", device="cuda", parallel=1, per_device=int(sys.argv[2]),
                                budget_s=float(sys.argv[3]), groups=tuple(sorted({j.group for j in jobs})),
                                data="stdlib", resume=True)

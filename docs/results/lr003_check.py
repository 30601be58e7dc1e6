"""Issue 24's check of `constrained_stage_lr_scale = 0.03` (docs/fidelity.md 3e): dense, subspace at 16x with
the default stage lr and at x0.03, one seed, at d=256 (the gpu plan's 3-3-2 shape at d=256, lr as the scale
group's ~1/sqrt(d)) and at d=1024 in 8 stages of 2 layers (the record preset's shape, batch 32 x 256 in one
microbatch as the gpu plan), each width in its own group with its own dense and baseline.
Usage: lr003_check.py OUT PER_DEVICE BUDGET_S STEPS_D256 STEPS_D1024"""
import sys

from protocol.spec import preset
from swarm.bench import fidelity
from swarm.bench.fidelity_plan import _job, dense, plan_shape

LOW = {"constrained_stage_lr_scale": 0.03}


def check_jobs(steps_256: int, steps_1024: int) -> list:
    base = plan_shape("gpu").base
    d256 = base.replace(d_model=256, n_heads=4, d_ff=int(256 * base.d_ff / base.d_model) // 8 * 8, rank=16,
                        lr=base.lr * (base.d_model / 256) ** 0.5, total_steps=steps_256)
    d1024 = preset("record", codec="subspace", dtype="bf16", rank=64, batch_size=32, microbatch_size=32,
                   basis_updates=False, total_steps=steps_1024)
    out = []
    for spec, group in ((d256, "lr003-d256"), (d1024, "lr003-d1024x8")):
        out += [_job("dense", group, dense(spec), 0),
                _job(f"subspace k={spec.rank} fixed U", group, spec, 0, "16x, stage lr x1 (default)"),
                _job("subspace, constrained stages lr x0.03", group, spec.replace(**LOW), 0, "16x")]
    return out


if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    jobs = check_jobs(int(sys.argv[4]), int(sys.argv[5]))
    fidelity.jobs_for = lambda plan, groups, best=None: jobs
    fidelity.run_fidelity_bench(sys.argv[1], plan="gpu", device="cuda", parallel=1, per_device=int(sys.argv[2]),
                                budget_s=float(sys.argv[3]), groups=("lr003-d256", "lr003-d1024x8"),
                                data="stdlib")

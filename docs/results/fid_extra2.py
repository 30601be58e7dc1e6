"""Like fid_extra.py (its jobs, resumed) plus: the dense floor of the 1-1-(L-2) layout (its L-2 free layers
alone), that layout at k=5 (~100x), k=5 at lr x0.5 with seeds 0-1; with `floor2000` that floor at the
headline's length, with `seeds3` seeds 1-2 of the bottleneck at k=d/16 and d/8, int8 at d/8 and the
floors, with `d1024` the scale group's d=1024 pair.
Usage: fid_extra2.py PLAN OUT PER_DEVICE BUDGET_S [floor2000] [seeds3] [d1024]"""
import sys

from fid_extra import b, extra_jobs, few

from swarm.bench.fidelity import bench as fidelity
from swarm.bench.fidelity.plan import GROUPS, _job, dense, jobs_for, plan_shape, scale_jobs

plan = sys.argv[1]


def more_jobs() -> list:
    free = b.n_layers - 2
    out = [_job(f"dense with only {free} layers (the floor of layers {'-'.join(map(str, few))})", "seeds",
                dense(b, n_layers=free, stage_layers=(free,)), 1),
           _job(f"layers {'-'.join(map(str, few))}, k=5", "seeds", b.replace(stage_layers=few, rank=5), 1, "~100x")]
    out += [_job(f"subspace k=5 lr x0.5 seed {i}", "seeds", b.replace(rank=5, lr=b.lr * 0.5, seed=i), 1, "~100x")
            for i in (0, 1)]
    if "floor2000" in sys.argv[5:]:  # the headline's length
        out.append(_job(f"dense with only {free} layers", "headline",
                        dense(b, n_layers=free, stage_layers=(free,), total_steps=plan_shape(plan).headline_steps), 1,
                        f"the floor of layers {'-'.join(map(str, few))}"))
    if "seeds3" in sys.argv[5:]:  # seeds 1-2 of the frontier rows that beat the subspace codec, and of the floors
        k = b.d_model // 16
        for i in (1, 2):
            out += [_job(f"bottleneck b={k} seed {i}", "seeds", b.replace(codec="bottleneck", rank=k, seed=i), 1),
                    _job(f"bottleneck b={2 * k} seed {i}", "seeds",
                         b.replace(codec="bottleneck", rank=2 * k, seed=i), 1)]
        out.append(_job(f"subspace int8 k={2 * k} seed 1", "seeds", b.replace(rank=2 * k, quant="int8", seed=1), 1))
        for layers in (b.stage_layers[-1], free):
            out.append(_job(f"dense with only {layers} layers seed 1", "seeds",
                            dense(b, n_layers=layers, stage_layers=(layers,), seed=1), 1))
    if "d1024" in sys.argv[5:]:
        widest = max(plan_shape(plan).scale_widths)
        out += [j for j in scale_jobs(plan_shape(plan)) if j.name.startswith(f"d={widest} ")]
    return out


if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    out, per_device, budget = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    plan_jobs = jobs_for
    fidelity.jobs_for = lambda p, groups, best=None: plan_jobs(p, groups, best) + extra_jobs() + more_jobs()
    fidelity.run_fidelity_bench(out, plan=plan, device="cuda" if plan == "gpu" else "cpu", parallel=1,
                                per_device=per_device, budget_s=budget,
                                groups=tuple(g for g in GROUPS if g != "scale"), data="stdlib",
                                best={"stage_layers": few}, resume=True)

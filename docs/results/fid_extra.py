"""`swarm bench fidelity` (every group but scale, --resume) plus the rows docs/fidelity.md section 3c needs:
the subspace baseline at k=5 (102x) with seeds 0-2, lr x0.5 and the 1-1-(L-2) layout with seeds 1-2
(their seed 0 is in the lr / layers groups), that layout at lr x0.5, and the headline (2000 steps)
with that layout as its best setting. Usage: fid_extra.py PLAN OUT PER_DEVICE BUDGET_S"""
import sys

from swarm.bench.fidelity import bench as fidelity
from swarm.bench.fidelity.plan import GROUPS, _job, jobs_for, plan_shape

plan = sys.argv[1]
s = plan_shape(plan)
b = s.base.replace(total_steps=s.steps)
few = (1, 1, b.n_layers - 2)  # 2 of L layers constrained: the layers group's best row


def extra_jobs() -> list:
    out = [_job(f"subspace k=5 seed {i}", "seeds", b.replace(rank=5, seed=i), 1, "~100x") for i in (0, 1, 2)]
    out += [_job(f"subspace lr x0.5 seed {i}", "seeds", b.replace(lr=b.lr * 0.5, seed=i), 1) for i in (1, 2)]
    out += [_job(f"layers {'-'.join(map(str, few))} seed {i}", "seeds", b.replace(stage_layers=few, seed=i), 1)
            for i in (1, 2)]
    out.append(_job(f"layers {'-'.join(map(str, few))}, lr x0.5", "seeds",
                    b.replace(stage_layers=few, lr=b.lr * 0.5), 1))
    return out


if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    out, per_device, budget = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    plan_jobs = jobs_for
    fidelity.jobs_for = lambda p, groups, best=None: plan_jobs(p, groups, best) + extra_jobs()
    fidelity.run_fidelity_bench(out, plan=plan, device="cuda" if plan == "gpu" else "cpu", parallel=1,
                                per_device=per_device, budget_s=budget,
                                groups=tuple(g for g in GROUPS if g != "scale"), data="stdlib",
                                best={"stage_layers": few}, resume=True)

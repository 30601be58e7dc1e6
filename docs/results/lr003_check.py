"""Issue 24's check of `constrained_stage_lr_scale = 0.03` (docs/fidelity.md 3e): dense, subspace at 16x with
the default stage lr and at x0.03, one seed, at d=256 (the gpu plan's 3-3-2 shape at d=256, lr as the scale
group's ~1/sqrt(d)) and at d=1024 in 8 stages of 2 layers (the record preset's shape, batch 32 x 256 in one
microbatch as the gpu plan), each width in its own group with its own dense and baseline.
Usage: lr003_check.py OUT PER_DEVICE BUDGET_S STEPS_D256 STEPS_D1024; lr003_check.py --plot FIDELITY_JSON PNG
draws the held-out curves of each group (the bench's own figure has no panel for these groups)."""
import sys

from protocol.spec import preset
from swarm.bench.fidelity import bench as fidelity
from swarm.bench.fidelity.plan import _job, dense, plan_shape

LOW = {"constrained_stage_lr_scale": 0.03}


def check_jobs(steps_256: int, steps_1024: int) -> list:
    base = plan_shape("gpu").base
    d256 = base.replace(d_model=256, n_heads=4, d_ff=int(256 * base.d_ff / base.d_model) // 8 * 8, rank=16,
                        lr=base.lr * (base.d_model / 256) ** 0.5, total_steps=steps_256)
    d1024 = preset("record", codec="subspace", dtype="bf16", rank=64, batch_size=32, microbatch_size=32,
                   basis_updates=False, total_steps=steps_1024, constrained_stage_lr_scale=1.0)
    out = []
    for spec, group in ((d256, "lr003-d256"), (d1024, "lr003-d1024x8")):
        out += [_job("dense", group, dense(spec), 0),
                _job(f"subspace k={spec.rank} fixed U", group, spec, 0, "16x, stage lr x1 (default)"),
                _job("subspace, constrained stages lr x0.03", group, spec.replace(**LOW), 0, "16x")]
    return out


def plot_curves(json_path: str, png: str) -> None:
    import json

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = json.loads(open(json_path).read())
    groups = list(dict.fromkeys(j["group"] for j in result["jobs"]))
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 3.8))
    for ax, group in zip(axes, groups):
        for j in (j for j in result["jobs"] if j["group"] == group):
            xs, ys = zip(*j["val"])
            ax.plot([x / 1e6 for x in xs], ys, marker=".", label=f"{j['name']}: {j['final_val']:.4f}")
        ax.set_title(group, fontsize=9)
        ax.set_xlabel("tokens (M)")
        ax.set_ylabel("held-out loss (nats/byte)")
        ax.set_ylim(top=min(ax.get_ylim()[1], 2.0))
        ax.legend(fontsize=7)
    fig.suptitle(f"constrained stages lr x0.03 vs default, 16x, one seed ({result['device_name']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


if __name__ == "__main__" and sys.argv[1] == "--plot":
    plot_curves(sys.argv[2], sys.argv[3])
elif __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    jobs = check_jobs(int(sys.argv[4]), int(sys.argv[5]))
    fidelity.jobs_for = lambda plan, groups, best=None: jobs
    fidelity.run_fidelity_bench(sys.argv[1], plan="gpu", device="cuda", parallel=1, per_device=int(sys.argv[2]),
                                budget_s=float(sys.argv[3]), groups=("lr003-d256", "lr003-d1024x8"),
                                data="stdlib")

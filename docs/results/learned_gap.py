"""Issue 24 item 2, learned per-stage projections, measured in one process before building them into the wire:
section 3i's corpus and shape (`small`, 3-3-2, d=512, 16x = 32 numbers a token, batch 32 x 256, lr 1e-3, bf16),
every boundary a learned projection U_i = qr(W_i).Q with a per-boundary anchor table on free stages
(swarm/bench/fidelity/learned_boundary.py), against dense and the hybrid's best (k=28 b=4) in the same call.
Usage: learned_gap.py OUT PER_DEVICE BUDGET_S STEPS SEEDS NAMES   (NAMES a comma list of dense, hybrid,
learned, learned-x0.03, learned-noanchor-x0.03, learned-fixedu-x0.03, learned-fixedu,
learned-noanchor, learned-projlr1-x0.03); OUT/fidelity.jsonl is resumed."""
import sys

from gap_corpus import LOW, run_jobs

from swarm.bench.fidelity.plan import dense, plan_shape
from swarm.bench.fidelity.train import Job

# name: (label, boundary, stage lr scale); every learned row is a dense spec of rank 32 (16x in bf16)
LEARNED = {"learned": ("learned U and anchor, every stage at the lr", "learned", 1.0),
           "learned-x0.03": ("learned U and anchor, stages lr x0.03", "learned", 0.03),
           "learned-noanchor-x0.03": ("learned U, no anchor, stages lr x0.03", "learned-noanchor", 0.03),
           "learned-fixedu-x0.03": ("random fixed U, learned anchor, stages lr x0.03", "learned-fixedu", 0.03),
           # second call: is it U that learns, and does the projection want its own lr
           "learned-fixedu": ("random fixed U, learned anchor, every stage at the lr", "learned-fixedu", 1.0),
           "learned-noanchor": ("learned U, no anchor, every stage at the lr", "learned-noanchor", 1.0),
           "learned-projlr1-x0.03": ("learned U and anchor at the lr, stages lr x0.03", "learned-projlr1", 0.03)}


def learned_jobs(steps: int, seeds: list[int], names: list[str]) -> list[Job]:
    base = plan_shape("gpu").base
    out = []
    for seed in seeds:
        b, group = base.replace(total_steps=steps, seed=seed), f"learned{steps}-seed{seed}"
        for n in names:
            if n == "dense":
                out.append(Job("dense", group, dense(b)))
            elif n == "hybrid":
                out.append(Job("hybrid k=28 b=4, stages lr x0.03", group,
                               b.replace(rank=28, residual_width=4, **LOW), note="16x"))
            else:
                label, boundary, scale = LEARNED[n]
                spec = dense(b).replace(rank=32, constrained_stage_lr_scale=scale)
                out.append(Job(label, group, spec, note="16x", boundary=boundary))
    return out


if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    run_jobs(learned_jobs(int(sys.argv[4]), [int(x) for x in sys.argv[5].split(",")], sys.argv[6].split(",")),
             sys.argv)

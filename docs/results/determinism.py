"""Dense's run-to-run spread on the GPU (docs/fidelity.md 3h, 6): the same job (spec, seed, data) trained twice
side by side, with and without `torch.use_deterministic_algorithms(True)`. Section 3i's corpus and shape
(`small`, d=512, bf16); dense and the hybrid's best (k=28 b=4, stages lr x0.03), each twice under two names.
Usage: DETERMINISTIC=0|1 determinism.py OUT PER_DEVICE BUDGET_S STEPS   (OUT/fidelity.jsonl is resumed)."""
import os
import sys

if os.environ.get("DETERMINISTIC") == "1":  # at import: the queue's spawned workers run this before CUDA starts
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    torch.use_deterministic_algorithms(True)

from gap_corpus import LOW, run_jobs  # noqa: E402

from swarm.bench.fidelity.plan import dense, plan_shape  # noqa: E402
from swarm.bench.fidelity.train import Job  # noqa: E402


def twin_jobs(steps: int) -> list[Job]:
    b = plan_shape("gpu").base.replace(total_steps=steps, seed=0)
    mode = "deterministic" if os.environ.get("DETERMINISTIC") == "1" else "default"
    group = f"twins{steps}-{mode}"
    hybrid = b.replace(rank=28, residual_width=4, **LOW)
    return [Job(name + again, group, spec) for name, spec in (("dense", dense(b)), ("hybrid", hybrid))
            for again in ("", ", again")]


if __name__ == "__main__":
    run_jobs(twin_jobs(int(sys.argv[4])), sys.argv)

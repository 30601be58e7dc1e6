"""Issue 24 item 2, MDCP-PP's residual vector quantization, measured in one process before building it into the
wire: section 3i's corpus and shape (`small`, 3-3-2, d=512, batch 32 x 256, lr 1e-3, bf16), on 3n's hybrid
defaults (stages before the last at lr x0.1, 300 warm-up steps). At 16x = 64 bytes a token forward, the hybrid's
k=28 exact numbers and b=4 bf16 numbers against k exact numbers and an e-number residual sent as M one-byte
RVQ codes (swarm/bench/fidelity/rvq_boundary.py): k=28 e=8 M=8 and k=24 e=16 M=16.
Usage: rvq_gap.py OUT PER_DEVICE BUDGET_S STEPS SEEDS NAMES   (NAMES a comma list of hybrid, rvq28-8, rvq24-16,
rvq30-4); OUT/fidelity.jsonl is resumed. No dense run: the gaps are taken against 3n's dense means on the same
corpus (OUT/corpus.json's sha256 says whether it is the same)."""
import sys

from gap_corpus import run_jobs, warmed

from swarm.bench.fidelity.plan import plan_shape
from swarm.bench.fidelity.train import Job


def coded(k: int, e: int, m: int) -> tuple[str, dict, str]:
    """3n's defaults with the hybrid's e lossy numbers sent as m codes: (label, spec changes, boundary)."""
    _, change, _ = warmed(k, e, 0.1)
    return f"hybrid k={k}, e={e} as {m} RVQ codes, x0.1, 300 warm-up steps", change, f"rvq{m}"


ROWS = {"hybrid": (*warmed(28, 4, 0.1)[:2], "codec"),
        "rvq28-8": coded(28, 8, 8),
        "rvq24-16": coded(24, 16, 16),
        "rvq30-4": coded(30, 4, 4)}


def rvq_jobs(steps: int, seeds: list[int], names: list[str]) -> list[Job]:
    base = plan_shape("gpu").base
    out = []
    for seed in seeds:
        b, group = base.replace(total_steps=steps, seed=seed), f"rvq{steps}-seed{seed}"
        for n in names:
            label, change, boundary = ROWS[n]
            out.append(Job(label, group, b.replace(**change), note="16x", boundary=boundary))
    return out


if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    run_jobs(rvq_jobs(int(sys.argv[4]), [int(x) for x in sys.argv[5].split(",")], sys.argv[6].split(",")),
             sys.argv)

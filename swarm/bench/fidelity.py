"""`swarm bench fidelity`: does the subspace model train as well as dense, and why not (docs/fidelity.md)?

Trains the jobs of a plan (`fidelity_plan.py`: the scale comparison at ~100x up to d=1024, the
headline at the `small` shape, the frontier of loss against compression, and one-cause
ablations) as independent in-process runs spread over the devices inside a time budget
(`fidelity_queue.py`), and writes, in `--out`:

- `fidelity.jsonl`: one line per job as it finishes (kept if the run is cut short);
- `fidelity.json`: the plan, the machine, every job (curves included) and the summary rows;
- `fidelity.md`: the summary as a markdown table; `fidelity.png`: frontier, ablations, scale.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .fidelity_plan import GROUPS, jobs_for
from .fidelity_queue import estimated_seconds, run_queue
from .fidelity_report import markdown_table, plot, summarize


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return "cpu"


def run_fidelity_bench(out_dir: str, plan: str = "gpu", device: str = "cpu", parallel: int = 1,
                       per_device: int = 1, budget_s: float = 540.0, groups: tuple[str, ...] = GROUPS,
                       data: str | None = "stdlib", best: dict | None = None, smoke: bool = False,
                       eval_batches: int = 16) -> dict:
    if smoke:
        plan, data, eval_batches = "smoke", None, 2
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = jobs_for(plan, groups, best)
    workers = parallel * per_device
    print(f"fidelity: {len(jobs)} jobs on {workers} worker(s) ({device}), budget {budget_s:.0f} s")
    kind = "cuda" if device.startswith("cuda") else "cpu"
    for j in jobs:
        print(f"  {j.key:<52} {j.spec.total_steps:5d} steps, {j.tokens / 1e6:6.2f}M tokens, "
              f"~{estimated_seconds(j, kind):.0f} s expected")
    t0 = time.time()
    results = run_queue(jobs, out, data, device, parallel, per_device, budget_s, eval_batches=eval_batches,
                        reserve_s=3.0 if smoke else 15.0, grace_s=10.0 if smoke else 30.0)
    rows = summarize(results)
    result = {"plan": plan, "device": device, "device_name": _device_name(device), "parallel": parallel,
              "per_device": per_device, "budget_s": budget_s, "wall_s": time.time() - t0, "groups": list(groups),
              "data": data, "rows": rows, "jobs": results}
    (out / "fidelity.json").write_text(json.dumps(result) + "\n")
    table = markdown_table(rows)
    (out / "fidelity.md").write_text(table + "\n")
    plot(results, rows, out / "fidelity.png", f"fidelity, plan {plan} on {result['device_name']}")
    print(table)
    return result


def expected_durations(plan: str, kind: str, groups: tuple[str, ...] = GROUPS) -> list[tuple[str, float]]:
    """(job, seconds) by the queue's prior speed model: what docs/fidelity.md quotes for the lead's run."""
    return [(j.key, estimated_seconds(j, kind)) for j in jobs_for(plan, groups)]

"""`swarm bench fidelity`: does the subspace model train as well as dense, and why not (docs/fidelity.md)?

Trains the jobs of a plan (`plan.py`: the scale comparison at ~100x up to d=1024, the
headline at the `small` shape, the frontier of loss against compression, and one-cause
ablations) as independent in-process runs spread over the devices inside a time budget
(`queue.py`). With `--dense-runs N` every dense job trains N times with the same spec and
every comparison with dense takes the mean of its N runs (dense on a GPU is not bit-repeatable).
Writes, in `--out`:

- `fidelity.jsonl`: one line per job as it finishes (kept if the run is cut short);
- `fidelity.json`: the plan, the machine, every job (curves included) and the summary rows;
- `fidelity.md`: the summary as a markdown table; `fidelity.png`: frontier, ablations, scale.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from swarm.bench.common.machine import machine_info

from .plan import GROUPS, jobs_for, with_dense_repeats
from .queue import estimated_seconds, run_queue, slots
from .report import markdown_table, plot, summarize


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return "cpu"


def run_fidelity_bench(out_dir: str, plan: str = "gpu", device: str = "cpu", parallel: int = 1,
                       per_device: int = 1, budget_s: float = 540.0, groups: tuple[str, ...] = GROUPS,
                       data: str | None = "stdlib", best: dict | None = None, smoke: bool = False,
                       eval_batches: int = 16, resume: bool = False, dense_runs: int = 1) -> dict:
    """Run the plan's jobs in `groups` and write the results (module docstring). `resume`: keep the jobs
    that `out_dir/fidelity.jsonl` already holds finished with the same spec, and run only the others.
    `dense_runs`: train every dense job that many times with the same spec (repeats named "NAME (run i)"),
    since dense on a GPU is not bit-repeatable (docs/fidelity.md 3m); every comparison with a dense
    reference then takes the mean of its runs (report.py)."""
    if smoke:
        plan, data, eval_batches = "smoke", None, 2
    # repeats are ordinary jobs: --resume keeps the finished ones and runs only the missing ones
    jobs = with_dense_repeats(jobs_for(plan, groups, best), dense_runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kept = finished_results(out / "fidelity.jsonl", jobs) if resume else []
    if not resume:
        (out / "fidelity.jsonl").unlink(missing_ok=True)
    have = {(r["group"], r["name"]) for r in kept}
    jobs_left = [j for j in jobs if (j.group, j.name) not in have]
    workers = parallel * per_device
    print(f"fidelity: {len(jobs_left)} jobs on {workers} worker(s) ({device}), budget {budget_s:.0f} s"
          + (f"; {len(kept)} kept from {out / 'fidelity.jsonl'}" if kept else ""))
    kind = "cuda" if device.startswith("cuda") else "cpu"
    for j in jobs_left:
        print(f"  {j.key:<52} {j.spec.total_steps:5d} steps, {j.tokens / 1e6:6.2f}M tokens, "
              f"~{estimated_seconds(j, kind):.0f} s expected")
    t0 = time.time()
    results = kept + run_queue(jobs_left, out, data, device, parallel, per_device, budget_s,
                               eval_batches=eval_batches, reserve_s=3.0 if smoke else 15.0,
                               grace_s=10.0 if smoke else 30.0)
    order = {(j.group, j.name): i for i, j in enumerate(jobs)}
    results.sort(key=lambda r: order[(r["group"], r["name"])])
    rows = summarize(results)
    used = list(dict.fromkeys(slots(device, parallel, per_device)))  # the devices the workers ran on
    result = {"plan": plan, "device": device, "device_name": _device_name(device), "devices": used,
              "machine": machine_info(used), "parallel": parallel,
              "per_device": per_device, "budget_s": budget_s, "wall_s": time.time() - t0, "groups": list(groups),
              "dense_runs": dense_runs, "data": data, "rows": rows, "jobs": results}
    (out / "fidelity.json").write_text(json.dumps(result) + "\n")
    table = markdown_table(rows)
    (out / "fidelity.md").write_text(table + "\n")
    plot(results, rows, out / "fidelity.png", f"fidelity, plan {plan} on {result['device_name']}")
    print(table)
    return result


def finished_results(path: Path, jobs: list) -> list[dict]:
    """The lines of an earlier run's fidelity.jsonl that finished a job of `jobs` with the same spec."""
    if not path.is_file():
        return []
    specs = {(j.group, j.name): j.spec.to_dict() for j in jobs}
    kept = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        key = (r["group"], r["name"])
        if specs.get(key) == r["spec"] and not r["error"] and not r["truncated"]:
            kept[key] = r
    return list(kept.values())


def expected_durations(plan: str, kind: str, groups: tuple[str, ...] = GROUPS) -> list[tuple[str, float]]:
    """(job, seconds) by the queue's prior speed model: what docs/fidelity.md quotes for the lead's run."""
    return [(j.key, estimated_seconds(j, kind)) for j in jobs_for(plan, groups)]

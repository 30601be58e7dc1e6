"""The job queue of `swarm bench fidelity`: independent training jobs spread over devices, inside a time budget.

One worker process per slot (`parallel` devices x `per_device` processes each, a device
named `cuda:i`, or all on the CPU), each taking the next job from one queue in priority
order. Every finished job comes back to the parent, which appends it as one JSON line to
`fidelity.jsonl` at once, so a run cut short keeps everything finished so far.

The budget: every job gets the deadline `start + budget_s - reserve_s`. A worker does not start a job
that its measured speed says cannot finish before the deadline (it records it as skipped,
and tries the next: a smaller one may fit); a job still running at the deadline stops there,
with its held-out loss at the step it reached, marked truncated. The parent stops waiting
`grace_s` after the deadline and ends any worker still alive, so the whole bench ends
inside `budget_s + grace_s`.

Speed: a step takes `overhead + tokens x FLOPs per token / rate` seconds (FLOPs per token =
6 N + 12 L T d, N the weights multiplied per token) until a worker has measured a job of the
same shape; from then on every worker uses the measured seconds per step of that shape.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import queue
import time
from collections.abc import Callable
from pathlib import Path

import torch

from protocol.spec import RunSpec

from .train import Job, JobResult, train_job

# (seconds of overhead per step, FLOP/s) one worker is assumed to reach before anything of the shape
# was measured: a guess to skip hopeless jobs early, not a claim. Small bf16 models in process are
# launch-bound on a GPU (the overhead); one CPU thread reaches a few tens of GFLOP/s
PRIOR = {"cuda": (0.02, 1.5e14), "cpu": (0.002, 3e10)}


def flops_per_token(spec: RunSpec) -> float:
    """6 N + 12 L T d, N = every block's q, k, v, o, gate, up, down and the LM head (dense count)."""
    d, f = spec.d_model, spec.d_ff
    n = spec.n_layers * (4 * d * d + 3 * d * f) + d * spec.vocab
    return 6 * n + 12 * spec.n_layers * spec.seq_len * d


def shape_of(spec: RunSpec) -> str:
    """What a step's time depends on (not the codec: a boundary costs little next to the blocks)."""
    return (f"d{spec.d_model}-L{spec.n_layers}-f{spec.d_ff}-T{spec.seq_len}-B{spec.batch_size}"
            f"-mb{spec.microbatch_size}-s{spec.n_stages}-{spec.dtype}")


def estimated_seconds(job: Job, kind: str, measured: dict | None = None,
                      prior: tuple[float, float] | None = None) -> float:
    """Seconds `job` should take: its shape's measured seconds per step, else the prior model."""
    per_step = (measured or {}).get(shape_of(job.spec))
    if per_step is None:
        overhead, rate = prior or PRIOR[kind]
        per_step = overhead + job.spec.batch_size * job.spec.seq_len * flops_per_token(job.spec) / rate
    return job.spec.total_steps * per_step


def _skipped(job: Job, device: str, why: str) -> JobResult:
    return JobResult(job.name, job.group, job.spec.to_dict(), job.note, job.compression(), 0, 0, float("nan"),
                     device=device, error=why, boundary=job.boundary)


def _worker(slot: int, device: str, jobs: multiprocessing.Queue, results: multiprocessing.Queue, data: str | None,
            deadline: float, measured: dict, prior: tuple[float, float], threads: int, eval_batches: int) -> None:
    torch.set_num_threads(threads)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    while True:
        item = jobs.get()
        if item is None:  # one stop mark per worker, after the last job
            return
        job = Job(item["name"], item["group"], RunSpec.from_json(item["spec"]), item["priority"], item["note"],
                  item["boundary"])
        left = deadline - time.time()
        need = estimated_seconds(job, kind, dict(measured), prior)
        if need > left:
            results.put(dataclasses.asdict(_skipped(job, device, f"skipped: needs ~{need:.0f} s, {max(0, left):.0f} s "
                                                                 f"were left")))
            continue
        try:
            res = train_job(job, data, device, eval_batches=eval_batches, deadline=deadline,
                            log=lambda s: print(f"[{slot} {device}] {s}", flush=True))
        except Exception as e:  # one job's failure (e.g. out of memory) must not take the others down
            res = _skipped(job, device, f"failed: {type(e).__name__}: {e}")
        if res.steps:
            measured[shape_of(job.spec)] = res.seconds / res.steps
        results.put(dataclasses.asdict(res))


def slots(device: str, parallel: int, per_device: int) -> list[str]:
    """The device of every worker: cuda:0..parallel-1 (per_device workers each, interleaved so that the
    first jobs, the longest, land on different GPUs), or cpu."""
    if device.startswith("cuda"):
        if parallel > torch.cuda.device_count():
            raise ValueError(f"--parallel {parallel} asks for more GPUs than the {torch.cuda.device_count()} "
                             f"this machine has; pass --parallel {torch.cuda.device_count()} or fewer.")
        return [f"cuda:{i}" for _ in range(per_device) for i in range(parallel)]
    return ["cpu"] * (parallel * per_device)


def run_queue(jobs: list[Job], out: Path, data: str | None, device: str, parallel: int, per_device: int,
              budget_s: float, reserve_s: float = 15.0, grace_s: float = 30.0, eval_batches: int = 16,
              prior: tuple[float, float] | None = None, on_result: Callable[[dict], None] | None = None
              ) -> list[dict]:
    """Run `jobs` (lowest priority value first) on the worker slots; returns every result dict.
    `prior`: (overhead s per step, FLOP/s) before a shape is measured (default: PRIOR of the device)."""
    devices = slots(device, parallel, per_device)
    start = time.time()
    deadline = start + budget_s - reserve_s
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked into children
    kind = "cuda" if device.startswith("cuda") else "cpu"
    prior = prior or PRIOR[kind]
    job_q, res_q = ctx.Queue(), ctx.Queue()
    manager = ctx.Manager()
    measured = manager.dict()  # shape -> seconds per step, shared by the workers
    # by priority, and the longest first within one: long jobs started late would set the end
    for job in sorted(jobs, key=lambda j: (j.priority, -estimated_seconds(j, kind))):
        job_q.put({"name": job.name, "group": job.group, "spec": job.spec.to_json(), "priority": job.priority,
                   "note": job.note, "boundary": job.boundary})
    for _ in devices:
        job_q.put(None)
    threads = 1 if kind == "cpu" else 2
    procs = [ctx.Process(target=_worker, args=(i, dev, job_q, res_q, data, deadline, measured, prior, threads,
                                               eval_batches), daemon=True) for i, dev in enumerate(devices)]
    for p in procs:
        p.start()
    results: list[dict] = []
    log = out / "fidelity.jsonl"
    with log.open("a") as f:
        while len(results) < len(jobs):
            try:
                r = res_q.get(timeout=1.0)
            except queue.Empty:
                if time.time() > deadline + grace_s or not any(p.is_alive() for p in procs):
                    break
                continue
            r["finished_s"] = time.time() - start
            results.append(r)
            f.write(json.dumps(r) + "\n")
            f.flush()
            if on_result is not None:
                on_result(r)
    for p in procs:
        p.join(timeout=max(0.0, deadline + grace_s - time.time()))
        if p.is_alive():  # past the grace period: its job's result is lost, the budget is not
            p.terminate()
            p.join(timeout=5)
    manager.shutdown()
    done = {(r["group"], r["name"]) for r in results}
    for job in jobs:
        if (job.group, job.name) not in done:
            results.append(dataclasses.asdict(_skipped(job, device, "not run: the budget ended first")))
    return results

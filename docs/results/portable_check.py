"""Do powersgd replicas on unlike machines agree bit for bit? (docs/algorithms.md 5.2, protocol/portable_linalg.py)

Two replicas of one `small` stage (and of a `large`-shaped set of factors) each take their own gradient; their
factors are summed as the swarm sums them (ascending peer order, on the CPU); then each replica finishes the step
on its own machine: on the CPU with 1 thread, on the CPU with every core, and on the GPU. Per machine: the bits of
P^ (round 2's basis), of the next Q and of the applied gradient G^, with the portable path (today's) and with
the old one (LAPACK's QR on the CPU, the device's GEMM), and the time each takes. Writes OUT/portable-check.json.

Usage (device machine, wheels installed as in docs/results/scale_gpu.sh; CPU-only runs skip the GPU rows):
    python docs/results/portable_check.py OUT
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from peer.runner.stage import StageRunner
from protocol import powersgd
from protocol.powersgd import PowerPlan, PowerState, first_round, orthonormal_factors, rebuild
from protocol.spec import preset
from protocol.subspace import orthonormalize
from swarm.bench.common.machine import machine_info


def digest(ts: list[torch.Tensor]) -> str:
    return hashlib.sha256(b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in ts)).hexdigest()[:16]


class OldPath:
    """The path before portable_linalg: LAPACK's QR and the device's GEMM (patched in for comparison)."""

    def __enter__(self):
        self.saved = powersgd.portable_orthonormalize, powersgd.portable_matmul
        powersgd.portable_orthonormalize = lambda As: [orthonormalize(a) for a in As]
        powersgd.portable_matmul = lambda X, Y: X @ Y.to(X)
        return self

    def __exit__(self, *exc):
        powersgd.portable_orthonormalize, powersgd.portable_matmul = self.saved


def stage_case(rank: int) -> dict:
    spec = preset("small", codec="subspace")
    runner = StageRunner(spec, 1)
    layout, plan = runner.layout, PowerPlan.for_layout(runner.layout, rank)
    g = torch.Generator().manual_seed(rank)
    flats = [torch.randn(layout.numel, generator=g) for _ in range(2)]
    state = PowerState.initial(layout, plan, 17, torch.float32)
    firsts = [first_round(layout, plan, state, f, torch.bfloat16) for f in flats]
    P_sum = firsts[0].P.float().clone().add_(firsts[1].P.float())
    Q_sum = torch.randn(plan.q_numel, generator=g)  # round 2's sum (its inputs are the replicas' own: local)
    exact_sum = firsts[0].exact + firsts[1].exact
    return {"layout": layout, "plan": plan, "P_sum": P_sum, "Q_sum": Q_sum, "exact_sum": exact_sum,
            "shapes": [layout.entries[i].shape for i in plan.compressed]}


def finish_on(case: dict, device: str, threads: int | None) -> dict:
    """What one replica computes from the sums on its machine: P^, the next Q, G^ (bits) and the seconds."""
    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    P_hat = orthonormal_factors(case["layout"], case["plan"], case["P_sum"], torch.float32)
    t1 = time.perf_counter()
    flat, q_next, _ = rebuild(case["layout"], case["plan"], case["exact_sum"], P_hat, case["Q_sum"], torch.float32,
                              device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"P_hat": digest(P_hat), "Q_next": digest(q_next), "G_hat": digest([flat]),
            "orth_P_s": t1 - t0, "rebuild_s": t2 - t1}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    cores = os.cpu_count() or 1
    machines = [("cpu", 1), ("cpu", cores)] + ([("cuda", cores)] if torch.cuda.is_available() else [])
    rows = []
    for rank in (8, 32):
        case = stage_case(rank)
        for path in ("portable", "old"):
            for device, threads in machines:
                for _ in range(2):  # the first call warms up (allocations, the GPU's kernels): its times are dropped
                    if path == "old":
                        with OldPath():
                            got = finish_on(case, device, threads)
                    else:
                        got = finish_on(case, device, threads)
                row = {"rank": rank, "path": path, "device": device, "threads": threads, **got}
                rows.append(row)
                print(json.dumps(row), flush=True)
    agree = {}
    for rank in (8, 32):
        for path in ("portable", "old"):
            rs = [r for r in rows if r["rank"] == rank and r["path"] == path]
            agree[f"r{rank}-{path}"] = {k: len({r[k] for r in rs}) == 1 for k in ("P_hat", "Q_next", "G_hat")}
    devices = ["cuda"] if torch.cuda.is_available() else ["cpu"]
    result = {"preset": "small", "stage": 1, "machine": machine_info(devices),
              "torch": torch.__version__, "rows": rows, "all_machines_agree": agree}
    (out / "portable-check.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(agree))


if __name__ == "__main__":
    main()

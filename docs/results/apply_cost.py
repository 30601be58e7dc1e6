"""What the portable apply costs (docs/algorithms.md 5.3): one replica's optimizer step with an agreed gradient
(unpack, clip, SubspaceAdamW) on a stage of each preset, timed with the portable operations (today's) and with
the apply as it was before them (a lone replica's path today: torch's fused operations and GEMMs, the
constrained gradients projected again), side by side in one process.
Writes OUT/apply-cost.json.

Usage: python docs/results/apply_cost.py OUT [DEVICE, default cuda] [PRESETS, default small,large]
"""
from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from peer.runner.stage import StageRunner
from protocol.spec import preset
from swarm.bench.common.machine import machine_info


@contextlib.contextmanager
def plain_ops(runner: StageRunner):
    """The apply as it was before: the loaded sum applied as a lone replica's own gradients are (torch's fused
    operations and GEMMs, the constrained gradients projected again)."""
    load = runner.load_flat_grads

    def plain_load(*args, **kwargs):
        load(*args, **kwargs)
        runner.grads_shared = runner.grads_in_span = False
    runner.load_flat_grads = plain_load
    try:
        yield
    finally:
        runner.load_flat_grads = load


def time_apply(runner: StageRunner, device: str, repeats: int) -> list[float]:
    flat = torch.randn(runner.layout.numel, generator=torch.Generator().manual_seed(0)).mul_(0.01).to(device)
    out = []
    for _ in range(repeats + 1):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.apply_flat(runner.step, flat, None if runner.stat is None else torch.zeros_like(runner.stat))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out[1:]  # the first warms up


def main() -> None:
    out_dir = Path(sys.argv[1])
    device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
    presets = (sys.argv[3] if len(sys.argv) > 3 else "small,large").split(",")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in presets:
        spec = preset(name, codec="subspace", dtype="bf16" if device.startswith("cuda") else None)
        runner = StageRunner(spec, 1, device)
        for path in ("portable", "plain", "portable", "plain"):  # interleaved: the machine's drift hits both
            with plain_ops(runner) if path == "plain" else contextlib.nullcontext():
                secs = time_apply(runner, device, 5)
            rows.append({"preset": name, "stage": 1, "path": path, "median_s": statistics.median(secs),
                         "seconds": secs, "layout_numel": runner.layout.numel, "params": runner.n_params})
            print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for name in presets:
        med = {p: statistics.median(r["median_s"] for r in rows if r["preset"] == name and r["path"] == p)
               for p in ("portable", "plain")}
        summary[name] = {**med, "portable_over_plain": med["portable"] / med["plain"]}
    (out_dir / "apply-cost.json").write_text(json.dumps({"device": device, "machine": machine_info([device]),
                                                         "rows": rows, "summary": summary}, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""GPU driver for issue 54 item 1: `swarm bench mfu` for `large` with and without `--compile` and at two
microbatch sizes, then a profile of one training step of the whole model (where the time goes, by kernel class).

Run on a GPU machine from the repository root: `python docs/results/mfu_gpu.py OUT_DIR`. Writes one folder per
configuration (mfu.json, mfu.png) and profile.json / profile.txt.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from protocol.reference import ReferenceModel
from protocol.spec import preset
from swarm.bench.hardware.mfu import run_mfu_bench

CLASSES = {  # kernel name fragments -> class (first match wins)
    "attention": ("flash", "fmha", "attention", "sdpa"),
    "matmul": ("nvjet", "gemm", "sm90_xmma", "cutlass", "matmul", "wgmma", "ampere_", "sm80_"),
    "optimizer": ("foreach", "multi_tensor", "adam"),
    "norm / rope / swiglu / elementwise": ("elementwise", "vectorized", "reduce", "triton", "norm", "silu", "mul",
                                           "add", "copy", "cat", "index", "embedding", "softmax", "nll", "log"),
}


def classify(name: str) -> str:
    low = name.lower()
    for cls, parts in CLASSES.items():
        if any(p in low for p in parts):
            return cls
    return "other"


def profile(out: Path, microbatch_size: int | None, compiled: bool) -> dict:
    spec = preset("large", codec="dense", dtype="bf16", microbatch_size=microbatch_size)
    dev = torch.device("cuda")
    model = ReferenceModel(spec, device="cuda", boundary=False)
    if compiled:
        for stage in model.stages:
            stage.compile_blocks()
    g = torch.Generator(device="cpu").manual_seed(0)
    batches = [torch.randint(0, spec.vocab, (spec.microbatch_size, spec.seq_len + 1), generator=g).to(dev)
               for _ in range(spec.n_microbatches)]
    for _ in range(3):
        model.train_step(lambda step, mb: batches[mb])
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile
    t0 = time.perf_counter()
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            model.train_step(lambda step, mb: batches[mb])
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / 2
    by_class: dict[str, float] = {}
    kernels = []
    for evt in prof.key_averages():
        dev_us = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0)
        if dev_us <= 0 or evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        by_class[classify(evt.key)] = by_class.get(classify(evt.key), 0.0) + dev_us / 2e6
        kernels.append((dev_us / 2e6, evt.count // 2, evt.key[:120]))
    kernels.sort(reverse=True)
    busy = sum(by_class.values())
    result = {"microbatch_size": spec.microbatch_size, "compiled": compiled, "step_wall_s": wall,
              "gpu_busy_s": busy, "idle_share": max(0.0, 1 - busy / wall),
              "by_class_s": dict(sorted(by_class.items(), key=lambda kv: -kv[1])),
              "top_kernels": [{"s": s, "calls": c, "name": n} for s, c, n in kernels[:30]]}
    name = f"profile-mb{spec.microbatch_size}{'-compiled' if compiled else ''}"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(name, json.dumps({k: v for k, v in result.items() if k != "top_kernels"}, indent=1))
    return result


def main() -> None:
    out = Path(sys.argv[1])
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    configs = {"plain": dict(), "compiled": dict(compile_blocks=True), "mb8": dict(microbatch_size=8),
               "mb8-compiled": dict(microbatch_size=8, compile_blocks=True)}
    if which in configs:
        run_mfu_bench(str(out / which), preset_name="large", device="cuda", **configs[which])
    elif which.startswith("profile"):
        mb = 8 if "mb8" in which else None
        profile(out, mb, compiled="compiled" in which)


if __name__ == "__main__":
    main()

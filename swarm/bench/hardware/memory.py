"""`swarm bench memory`: each stage's measured peak memory against `peer/runner/memory_estimate.py`,
and the smallest common card it trains on.

For each preset, option (activation checkpointing off/on) and stage it builds the stage on
the device, runs two training steps as a pipeline stage does (every microbatch forward, then
every gradient back, then the optimizer; the first step creates the optimizer moments) and
records `torch.cuda.max_memory_allocated` less what was allocated before the stage was
built, next to the estimate. With `--caps`, it then caps the process at each card class in
turn (`torch.cuda.set_per_process_memory_fraction` at the card less `CARD_OVERHEAD`, smallest
first) and runs one more step, until one fits: the smallest card the stage trains on.
Writes memory.json and, where matplotlib is installed, memory.png (`plot`, which also
redraws from a JSON: `python -m swarm.bench.hardware.memory --plot memory.json`).

Imports only protocol/, peer/ and torch, so it also runs where hivemind is not installed
(`python -m swarm.bench.hardware.memory ...`).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

from peer.runner.memory_estimate import (
    CARD_OVERHEAD,
    CARDS_GB,
    GIB,
    describe_t_fixed,
    estimate_stage,
    smallest_card,
    t_fixed_rows,
)
from peer.runner.stage import StageRunner
from protocol.spec import preset
from swarm.bench.common.machine import machine_info


def _train_step(runner: StageRunner, inputs: tuple) -> None:
    """One step of a stage in a pipeline: all forwards (graphs kept), then all backwards, then the optimizer."""
    tokens, z_in, grad_out = inputs
    spec, step = runner.spec, runner.step
    for mb in range(spec.n_microbatches):
        if runner.is_last:
            runner.forward_backward(step, mb, tokens, z_in)
        else:
            runner.forward(step, mb, tokens, z_in)
    if not runner.is_last:
        for mb in range(spec.n_microbatches):
            runner.backward(step, mb, grad_out)
    runner.optimizer_step()


def _inputs(spec, stage: int, device: torch.device) -> tuple:
    g = torch.Generator().manual_seed(stage)
    B, T, w = spec.microbatch_size, spec.seq_len, spec.boundary_width
    tokens = torch.randint(0, spec.vocab, (B, T + 1), generator=g).to(device)
    z_in = None if stage == 0 else torch.randn(B, T, w, generator=g).to(device)
    grad_out = None if stage == spec.n_stages - 1 else (torch.randn(B, T, w, generator=g) * 1e-3).to(device)
    return tokens, z_in, grad_out


def _free(device: torch.device) -> None:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0, device)


def cublas_runtime(device: torch.device) -> int:
    """Bytes cuBLAS's workspaces take from torch's allocator once matmuls ran (fp32 and bf16, forward
    and backward): allocated once per process, before any stage, so each stage's measurement adds them."""
    before = torch.cuda.memory_allocated(device)
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(256, 256, device=device, dtype=dtype, requires_grad=True)
        (a @ a).sum().backward()
        del a
    gc.collect()
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device) - before


def measure_stage(spec, stage: int, device: torch.device, checkpointing: bool, caps: list[int],
                  runtime: int = 0) -> dict:
    """Peak allocated bytes of two steps of `stage` (plus `runtime`, the cuBLAS workspaces allocated
    before it), its step time, and the smallest cap in `caps` it runs under."""
    _free(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    runner = StageRunner(spec, stage, device, checkpointing=checkpointing)
    build_s = time.perf_counter() - t0
    inputs = _inputs(spec, stage, device)
    _train_step(runner, inputs)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    _train_step(runner, inputs)
    torch.cuda.synchronize(device)
    step_s = time.perf_counter() - t0
    measured = torch.cuda.max_memory_allocated(device) - base + runtime
    est = estimate_stage(spec, stage, device=str(device), checkpointing=checkpointing)
    row = {"stage": stage, "checkpointing": checkpointing, "measured": measured, "estimate": est.peak,
           "error": est.peak / measured - 1, "breakdown": est.to_dict(), "build_s": build_s, "step_s": step_s,
           "tokens_per_s": spec.batch_size * spec.seq_len / step_s,
           "estimated_card_gb": smallest_card(est.peak), "fits_gb": None, "tried_gb": []}
    total = torch.cuda.get_device_properties(device).total_memory
    for gb in caps:
        budget = gb * GIB - CARD_OVERHEAD
        if budget >= total:
            break
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(budget / total, device)
        try:
            _train_step(runner, inputs)
            torch.cuda.synchronize(device)
            ok = True
        except torch.OutOfMemoryError:
            runner.abort_step()
            ok = False
        row["tried_gb"].append([gb, ok])
        if ok:
            row["fits_gb"] = gb
            break
    del runner, inputs
    _free(device)
    return row


def run_memory_bench(out_dir: str, presets: list[str], device: str = "cuda", dtype: str = "bf16",
                     stages: str = "ends", options: str = "both", caps: bool = True, smoke: bool = False,
                     vocab: int | None = None) -> dict:
    """Every chosen (preset, option, stage): measured vs estimated peak, and the smallest card it trains on
    (`vocab`: every preset at that vocabulary instead of its own). Before measuring it prints, and the JSON
    keeps, each preset's T_fixed at 256 and at 32k-128k vocabularies (`t_fixed_rows`)."""
    t_fixed = {name: t_fixed_rows(preset(name, dtype=dtype, vocab=vocab)) for name in (["tiny"] if smoke else presets)}
    for name in t_fixed:
        print(f"{name}: {describe_t_fixed(preset(name, dtype=dtype, vocab=vocab))}", flush=True)
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise SystemExit("swarm bench memory measures torch.cuda.max_memory_allocated: run it on a GPU "
                         "(--device cuda).")
    if dev.index is None:  # the memory calls want an index
        dev = torch.device("cuda", torch.cuda.current_device())
    if smoke:
        presets = ["tiny"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint_options = {"both": [False, True], "off": [False], "on": [True]}[options]
    rows = []
    runtime = cublas_runtime(dev)
    print(f"cuBLAS workspaces: {runtime} bytes", flush=True)
    for name in presets:
        spec = preset(name, dtype=dtype, vocab=vocab)
        chosen = _stages(spec.n_stages, stages)
        for ck in checkpoint_options:
            for s in chosen:
                try:
                    row = measure_stage(spec, s, dev, ck, list(CARDS_GB) if caps else [], runtime)
                except torch.OutOfMemoryError as e:  # larger than the whole device: say so and go on
                    _free(dev)
                    row = {"stage": s, "checkpointing": ck, "measured": None, "error": None, "oom": str(e)[:200],
                           "estimate": estimate_stage(spec, s, device=str(dev), checkpointing=ck).peak}
                row["preset"] = name
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "breakdown"}), flush=True)
                (out / "memory.json").write_text(json.dumps(_result(rows, dev, dtype, runtime), indent=1) + "\n")
    result = {**_result(rows, dev, dtype, runtime), "vocab": vocab, "t_fixed": t_fixed}
    (out / "memory.json").write_text(json.dumps(result, indent=1) + "\n")
    try:
        plot(result, out / "memory.png")
    except ImportError:
        print("matplotlib is not installed: memory.png not drawn "
              "(python -m swarm.bench.hardware.memory --plot memory.json)")
    return result


def _stages(n: int, which: str) -> list[int]:
    if which == "all":
        return list(range(n))
    if which == "ends":  # the first, a middle one and the last differ; the middle ones are alike
        return sorted({0, min(1, n - 1), n - 1})
    return [int(x) for x in which.split(",")]


def _result(rows: list[dict], device: torch.device, dtype: str, runtime: int) -> dict:
    return {"bench": "memory", "device": str(device), "device_name": torch.cuda.get_device_name(device),
            "total_memory": torch.cuda.get_device_properties(device).total_memory,
            "machine": machine_info([str(device)]), "torch": torch.__version__, "dtype": dtype,
            "cards_gb": list(CARDS_GB), "card_overhead": CARD_OVERHEAD, "cublas_runtime": runtime, "rows": rows}


def plot(result: dict, path: Path) -> None:
    """Bars: estimate and measured peak per (preset, stage, option); lines: what 8/12/16/24 GB cards hand out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in result["rows"] if r.get("measured")]
    labels = [f"{r['preset']} s{r['stage']}{' ckpt' if r['checkpointing'] else ''}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows) + 2), 4.5))
    ax.bar([i - 0.2 for i in x], [r["estimate"] / GIB for r in rows], 0.4, label="estimate")
    ax.bar([i + 0.2 for i in x], [r["measured"] / GIB for r in rows], 0.4, label="measured (max_memory_allocated)")
    for gb in (8, 12, 16, 24):
        ax.axhline((gb * GIB - result["card_overhead"]) / GIB, color="grey", lw=0.8, ls="--")
        ax.text(-0.6, (gb * GIB - result["card_overhead"]) / GIB, f"{gb} GB card", fontsize=7,
                va="bottom", ha="left", color="grey")
    ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("peak memory of one stage, GiB")
    ax.set_title(f"Stage peak memory, {result['dtype']}, {result['device_name']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """`python -m swarm.bench.hardware.memory`: the bench's flags without the `swarm` CLI (and without hivemind)."""
    from swarm.bench.common.flags import resolve_bench_dtype

    from .flags import add_memory
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--plot"]:
        path = Path(argv[1])
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return 0
    parser = argparse.ArgumentParser(prog="python -m swarm.bench.hardware.memory")
    add_memory(parser.add_subparsers(dest="which", required=True))
    a = parser.parse_args(["memory", *argv])
    resolve_bench_dtype(a)
    run_memory_bench(a.out, presets=a.presets.split(","), device=a.device, dtype=a.dtype, stages=a.stages,
                     options=a.checkpointing, caps=not a.no_caps, smoke=a.smoke, vocab=a.vocab)
    return 0


if __name__ == "__main__":
    sys.exit(main())

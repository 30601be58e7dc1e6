"""`swarm bench scale`: how tokens/s grows with GPUs, layout by layout, against one GPU.

A layout `SxR` is S pipeline stages with R replicas each (`1xR`: R heads of one stage, pure
data parallel; `Sx1`: a pipeline; `SxR`: both). Each is a full `swarm local` run (separate
processes over libp2p) whose peers take `--devices` round robin in the order they start, so
`--layouts 1x1,1x2,2x1 --devices cuda:0,cuda:1` gives the one-head run one GPU and the others two.
Beside them, in the same invocation, the whole model trained in one process on the first device
(`swarm.bench.hardware.mfu.train_rate`, no swarm at all): the "one GPU" every ratio is taken against.

Per layout: the seconds from its start to its first step, tokens/s over the steps after
`--warmup` (sum of tokens / sum of step seconds), the median step time and the slowest step over
the median (a stall shows there), the most bytes a replica sent per step to keep its stage in
step, each peer's uplink busy fraction where the links are shaped and its worker thread's busy
fraction (`worker_busy`: the seconds it computed, packed and stepped over the training time; both
lists one figure a peer, stage by stage, each stage's replicas in order), and

    vs_one_process = tokens/s / one process's tokens/s;   vs_first = tokens/s / the first layout's.

`--repeat N` measures every layout and the one-process run N times, in rounds (one of each per round,
so that a drift of the machine falls on all of them alike); each ratio then takes medians, and
`spread` gives per layout its rounds' min, max and (max - min) / median: runs of the same code on
one GPU machine came out up to 18% apart (docs/benchmarks.md), so a change smaller than the spread
does not show in one round. `--layout-limit` ends a layout after that many seconds with what it did so far (marked
incomplete). Each layout's logs stay in OUT/logs/SxR. `--resume` keeps the layouts already in OUT/scale.json
(same preset, codec, dtype, link, devices, batch and window) and runs the rest: GPU time comes in pieces.
`--batch-size` and `--microbatches-in-flight` give every layout and the one-process run a larger step
(issue 22 item 2: more microbatches a step shrink the pipeline's fill and drain and the reduce's share
of the step; the window keeps stage 0's saved activations to a card).
Absolute figures mean something only on the machine the JSON names.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from protocol.spec import preset
from swarm.bench.common.machine import machine_info
from swarm.local import LocalOptions, LocalSwarm, parse_devices


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """"1x1,1x2,2x1" -> [(1, 1), (1, 2), (2, 1)]: (stages, replicas per stage)."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            s, r = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"layout {part!r} is not STAGESxREPLICAS; write e.g. 1x1,1x2,2x1.") from None
        if s < 1 or r < 1:
            raise ValueError(f"layout {part!r} needs at least 1 stage and 1 replica; write e.g. 1x1,1x2,2x1.")
        out.append((s, r))
    if not out:
        raise ValueError("--layouts names no layout; write e.g. 1x1,1x2,2x1.")
    return out


def _config(preset_name: str, codec: str, dtype: str | None, bandwidth: str | None, latency: str,
            replica_sync: str, devices: list[str], steps: int, warmup: int, batch_size: int | None = None,
            in_flight: int = 0) -> dict:
    out = {"preset": preset_name, "codec": codec, "dtype": dtype, "bandwidth": bandwidth or "unlimited",
           "latency": latency, "replica_sync": replica_sync, "devices": devices, "steps": steps, "warmup": warmup}
    # named only when set, so that a JSON written before these options still resumes
    return out | ({"batch_size": batch_size} if batch_size else {}) | \
        ({"microbatches_in_flight": in_flight} if in_flight else {})


def _layout_run(spec, steps: int, warmup: int, replicas: int, bandwidth: str | None, latency: str,
                devices: list[str], workdir: Path, limit_s: float | None) -> dict:
    """One layout's swarm, until its head is done or `limit_s` passed (then what it did so far,
    marked incomplete: a layout too slow for the time a GPU session has still says how slow)."""
    swarm = LocalSwarm(LocalOptions(spec, steps=steps, replicas=replicas, bandwidth=bandwidth,
                                    latency=latency if bandwidth else "0", device=devices[0],
                                    devices=",".join(devices), quiet=True, workdir=str(workdir)))
    t0 = time.time()
    try:
        swarm.start()
        deadline = time.monotonic() + limit_s if limit_s else float("inf")
        while not (done := swarm.step_events()[1]) and time.monotonic() < deadline:
            swarm._check_alive()
            time.sleep(0.5)  # poll the heads' reports
        if done:
            swarm.wait_for_head()  # the head leaves by itself after its last step
        swarm.stop()  # peers write their wire counters as they leave
        records = swarm.step_events()[0]
        m = swarm.metrics(records) if records else None
    finally:
        swarm.stop(grace=5.0)
    row = {"stages": spec.n_stages, "replicas": replicas, "peers": spec.n_stages * replicas,
           "devices": sorted({devices[i % len(devices)] for i in range(spec.n_stages * replicas)}),
           "completed": bool(done), "steps_done": len(records),
           "seconds_to_first_step": records[0]["time"] - t0 if records else None,
           "step_seconds": [r["seconds"] for r in records]}
    timed = records[warmup:]
    if m is None or not timed:
        return row | {"tokens_per_second": None}
    seconds = [r["seconds"] for r in timed]
    median = statistics.median(seconds)
    return row | {"tokens_per_second": sum(r["tokens"] for r in timed) / max(sum(seconds), 1e-9),
                  "median_step_seconds": median, "slowest_over_median": max(seconds) / max(median, 1e-9),
                  "sync_bytes_per_step": m["sync"]["max_bytes_per_step"],
                  "commit_seconds": m["sync"]["commit_seconds"], "commit_parts": m["sync"]["commit_parts"],
                  "first_loss": records[0]["loss"],
                  "final_loss": records[-1]["loss"],
                  "uplink_busy": [p["uplink_busy_fraction"] for p in m["peers"] if "uplink_busy_fraction" in p],
                  "worker_busy": [p["worker_busy_fraction"] for p in m["peers"] if "worker_busy_fraction" in p]}


def _one_process(spec, device: str, steps: int, warmup: int) -> dict:
    import torch

    from .mfu import train_rate
    train = train_rate(spec, torch.device(device), steps=steps, warmup=warmup, compile_blocks=False)
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()  # the peers that follow share this card: leave them its memory
    return {"tokens_per_second": train["tokens_per_second"], "device": device,
            "median_step_seconds": statistics.median(train["step_seconds"])}


def run_scale_bench(out_dir: str, preset_name: str = "small", layouts: str = "1x1,1x2,2x1", codec: str = "subspace",
                    dtype: str | None = None, devices: str | None = None, device: str = "cpu", steps: int = 20,
                    warmup: int = 3, bandwidth: str | None = None, latency: str = "0", replica_sync: str = "exact",
                    baseline: bool = True, resume: bool = False, limit_s: float | None = None,
                    smoke: bool = False, batch_size: int | None = None, in_flight: int = 0, repeat: int = 1) -> dict:
    """Each layout of `layouts` as a local swarm beside the whole model in one process (see the module
    docstring), `repeat` rounds of them all, interleaved; `batch_size` (sequences a step) and `in_flight`
    (`RunSpec.microbatches_in_flight`) override the preset's."""
    if smoke:
        preset_name, steps, warmup, layouts = "tiny", 4, 1, "1x2"
    chosen = parse_layouts(layouts)
    if warmup >= steps:
        raise ValueError(f"--warmup {warmup} leaves none of {steps} steps to time; take more --steps.")
    if repeat < 1:
        raise ValueError(f"--repeat {repeat} runs nothing; give 1 or more rounds.")
    used = parse_devices(devices) or [device]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "scale.json"
    config = _config(preset_name, codec, dtype, bandwidth, latency, replica_sync, used, steps, warmup, batch_size,
                     in_flight)
    result = {"config": config, "machine": machine_info(used), "one_process": None, "one_process_runs": [], "runs": []}
    if resume and path.exists():
        old = json.loads(path.read_text())
        if old.get("config") == config:
            # a JSON written before rounds: its one-process run and its layouts are round 0
            old.setdefault("one_process_runs", [old["one_process"]] if old.get("one_process") else [])
            result = old
            print(f"resuming: {len(old['runs'])} layout run(s) already in {path}")
        else:
            print(f"not resuming: {path} holds another configuration; starting over")

    def save() -> None:
        result["one_process"] = _median_run(result["one_process_runs"])
        result["ratios"], result["spread"] = _ratios(result), _spread(result)
        path.write_text(json.dumps(result, indent=1) + "\n")

    done = {(r["stages"], r["replicas"], r.get("round", 0)) for r in result["runs"]}
    for rnd in range(repeat):
        if baseline and len(result["one_process_runs"]) <= rnd:
            whole = preset(preset_name, codec=codec, dtype=dtype, stages=1, batch_size=batch_size)
            run = _one_process(whole, used[0], steps - warmup, warmup) | {"round": rnd}
            result["one_process_runs"].append(run)
            save()
            print(f"one process on {used[0]}: {run['tokens_per_second']:9.0f} tok/s{_of(rnd, repeat)}", flush=True)
        for stages, replicas in chosen:
            if (stages, replicas, rnd) in done:
                continue
            spec = preset(preset_name, codec=codec, dtype=dtype, stages=stages, replica_sync=replica_sync,
                          batch_size=batch_size, microbatches_in_flight=in_flight or None)
            logs = out / "logs" / (f"{stages}x{replicas}" + (f"-{rnd}" if rnd else ""))
            row = _layout_run(spec, steps, warmup, replicas, bandwidth, latency, used, logs, limit_s) | {"round": rnd}
            result["runs"].append(row)
            save()
            _say(row, limit_s, _of(rnd, repeat))
    save()
    _plot(result, out / "scale.png")
    for k, v in result["ratios"].items():
        print(f"{k}: {v:.2f}")
    for k, v in result["spread"].items():
        if v["rounds"] > 1:
            print(f"{k}: {v['rounds']} rounds, {v['min']:.0f}..{v['max']:.0f} tok/s (spread {v['spread']:.2f})")
    return result


def _of(rnd: int, repeat: int) -> str:
    return f" (round {rnd + 1} of {repeat})" if repeat > 1 else ""


def _say(row: dict, limit_s: float | None, rounds: str) -> None:
    where = f"{row['stages']} stage(s) x {row['replicas']} replica(s) on {', '.join(row['devices'])}"
    if row["tokens_per_second"] is None:
        print(f"{where}: {row['steps_done']} step(s) in {limit_s:g} s, too few to time{rounds}", flush=True)
        return
    print(f"{where}: {row['tokens_per_second']:9.0f} tok/s, median step {row['median_step_seconds']:.3f} s, "
          f"slowest x{row['slowest_over_median']:.1f}" + ("" if row["completed"] else
                                                           f" ({row['steps_done']} steps in {limit_s:g} s)") + rounds,
          flush=True)


def _median_run(runs: list[dict]) -> dict | None:
    """The one-process figure the ratios use: the median over its rounds (the run itself with one)."""
    if not runs:
        return None
    if len(runs) == 1:
        return runs[0]
    return {"tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs), "device": runs[0]["device"],
            "median_step_seconds": statistics.median(r["median_step_seconds"] for r in runs), "rounds": len(runs)}


def _by_layout(result: dict) -> dict[str, list[float]]:
    """Layout name -> its timed rounds' tokens/s, layouts in the order first run."""
    out: dict[str, list[float]] = {}
    for r in result["runs"]:
        if r["tokens_per_second"]:
            out.setdefault(f"{r['stages']}x{r['replicas']}", []).append(r["tokens_per_second"])
    return out


def _ratios(result: dict) -> dict[str, float]:
    """Each layout's median tokens/s over its rounds, against the one process's median and the first layout's."""
    base, layouts = result["one_process"], _by_layout(result)
    out = {}
    first = next(iter(layouts), None)
    for name, rates in layouts.items():
        if base:
            out[f"{name}_over_one_process"] = statistics.median(rates) / base["tokens_per_second"]
        out[f"{name}_over_{first}"] = statistics.median(rates) / statistics.median(layouts[first])
    return out


def _spread(result: dict) -> dict[str, dict]:
    """Per layout (and the one process): rounds, median, min, max and spread = (max - min) / median: how far
    apart runs of the same code on the same machine came out, the bar a change must clear to show."""
    rates = ({"one_process": [r["tokens_per_second"] for r in result["one_process_runs"]]}
             if result["one_process_runs"] else {}) | _by_layout(result)
    out = {}
    for name, v in rates.items():
        med = statistics.median(v)
        out[name] = {"rounds": len(v), "median": med, "min": min(v), "max": max(v), "spread": (max(v) - min(v)) / med}
    return out


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spread = result["spread"]  # bars: the median of each one's rounds; whiskers: its slowest and fastest round
    names = (["one_process"] if "one_process" in spread else []) + \
        list(dict.fromkeys(f"{r['stages']}x{r['replicas']}" for r in result["runs"]))
    med = [spread[n]["median"] if n in spread else 0.0 for n in names]
    low = [m - spread[n]["min"] if n in spread else 0.0 for n, m in zip(names, med)]
    high = [spread[n]["max"] - m if n in spread else 0.0 for n, m in zip(names, med)]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4))
    ax.bar([n.replace("_", " ").replace("x", " x ") if n != "one_process" else "one process" for n in names], med,
           yerr=[low, high], capsize=4, color=["grey" if n == "one_process" else "tab:blue" for n in names])
    ax.set_ylabel("tokens / s")
    ax.set_xlabel("stages x replicas per stage")
    c = result["config"]
    ax.set_title(f"{c['preset']}, {c['codec']}, {c['dtype'] or 'preset dtype'}, link {c['bandwidth']}, "
                 f"sync {c['replica_sync']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""`swarm bench verify`: what spot checks cost (issue 21, peer/checks/spot_checks.py).

An in-memory swarm of the preset (`peer/replica/memory_swarm.py`: every peer in this process, messages
through the real encoders over loopback links, each host's uplink shaped to --bandwidth) with
one head and --replicas replicas of every other stage, all on --device and computing in --dtype (auto:
bf16 on a CUDA card, as a GPU run would), trained for --steps steps at each spot-check
rate in turn (0, the default 1/16, and 1: every share recomputed), the rates interleaved over
--repeats rounds so that drift of a noisy machine hits each alike. Per rate: tokens/s (steps 2..N),
its ratio to no checks, the shares recomputed per step (of the checkable ones: a replica's non-empty
share in a stage with another replica to recompute it) and the input bytes a check fetched per step.
The peers share this machine's compute, so the ratio counts a check's extra compute as the swarm
pays it; on separate hosts a check runs on a checker that is otherwise idle at the commit.

Writes verify.json and verify.png into --out.
"""
from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path

from peer.replica.memory_swarm import make_swarm
from protocol.spec import preset
from swarm.bench.common.machine import machine_info

from .replica_sync import SLOW, shaped_link

RATES = (0.0, 1 / 16, 1.0)


async def _run(spec, replicas: int, steps: int, rate: float, device: str, data: str | None, bandwidth: str | None,
               latency: str) -> dict:
    options = dict(SLOW, driver_options=dict(SLOW["driver_options"], spot_check_rate=rate))
    swarm = await make_swarm(spec, [1] + [replicas] * (spec.n_stages - 1), shaped_link(bandwidth, latency),
                             device=device, data=data, **options)
    try:
        logs = await swarm.drive(steps)
    finally:
        await swarm.stop()
    timed = logs[1:] or logs  # the first step includes warm-up
    seconds = sum(log.seconds for log in timed)
    peers = list(swarm.peers.values())
    checks = sum(p.commit.share_check.checks_run for p in peers)
    leader = next(p for p in peers if p.driver is not None)
    return {"rate": rate, "steps": len(logs), "tokens_per_second": sum(log.tokens for log in timed) / seconds,
            "step_seconds": seconds / len(timed), "checks_per_step": checks / len(logs),
            "checkable_per_step": leader.driver.spot.checkable / len(logs),
            "input_bytes_per_step": sum(p.commit.share_check.input_bytes for p in peers) / len(logs),
            "attempts": sum(log.attempts for log in logs), "banned": list(leader.driver.spot.convicted),
            "final_loss": logs[-1].loss}


def run_verify_bench(out_dir: str, preset_name: str = "tiny", steps: int = 12, replicas: int = 3, repeats: int = 2,
                     device: str = "cpu", data: str | None = None, bandwidth: str | None = "80mbit",
                     latency: str = "0", stages: int | None = 3, dtype: str | None = None,
                     smoke: bool = False) -> dict:
    if smoke:
        preset_name, steps, replicas, repeats, stages = "tiny", 3, 2, 1, 2
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = preset(preset_name, stages=stages, codec="subspace", dtype=dtype)
    runs: list[dict] = []
    for round_ in range(repeats):
        for rate in RATES:
            row = asyncio.run(_run(spec, replicas, steps, rate, device, data, bandwidth, latency))
            runs.append({**row, "round": round_})
            print(f"round {round_ + 1}/{repeats}, spot-check rate {rate:.4g}: {row['tokens_per_second']:.0f} tok/s, "
                  f"{row['checks_per_step']:.2f} checks and {row['input_bytes_per_step'] / 1e3:.1f} kB of inputs "
                  f"per step", flush=True)
    summary = []
    base = statistics.median(r["tokens_per_second"] for r in runs if r["rate"] == 0)
    for rate in RATES:
        rows = [r for r in runs if r["rate"] == rate]
        tps = statistics.median(r["tokens_per_second"] for r in rows)
        summary.append({"rate": rate, "tokens_per_second": tps, "ratio_to_unchecked": tps / base,
                        "step_seconds": statistics.median(r["step_seconds"] for r in rows),
                        "checks_per_step": statistics.mean(r["checks_per_step"] for r in rows),
                        "checkable_per_step": statistics.mean(r["checkable_per_step"] for r in rows),
                        "input_bytes_per_step": statistics.mean(r["input_bytes_per_step"] for r in rows),
                        "banned": sorted({p for r in rows for p in r["banned"]})})
        print(f"rate {rate:.4g}: {tps:.0f} tok/s = {tps / base:.3f} of no checks", flush=True)
    result = {"device": device, "devices": [device], "machine": machine_info([device]), "preset": preset_name,
              "dtype": spec.dtype,
              "replicas": replicas, "bandwidth": bandwidth, "latency": latency, "steps": steps, "repeats": repeats,
              "spec": spec.to_dict(), "runs": runs, "summary": summary}
    (out / "verify.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "verify.png")
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["summary"]
    labels = ["off" if r["rate"] == 0 else "1/16" if abs(r["rate"] - 1 / 16) < 1e-9 else f"{r['rate']:g}" for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.bar(labels, [r["ratio_to_unchecked"] for r in rows], color="tab:blue")
    a.set_ylabel("tokens/s, ratio to no checks")
    a.set_xlabel("spot-check rate")
    a.axhline(0.9, color="grey", ls="--", lw=1, label="target at 1/16: >= 0.9")
    a.legend(fontsize=8)
    b.bar(labels, [r["input_bytes_per_step"] / 1e3 for r in rows], color="tab:orange")
    b.set_ylabel("input bytes fetched per step (kB)")
    b.set_xlabel("spot-check rate")
    fig.suptitle(f"spot checks: {result['preset']}, 1 head + {result['replicas']} replicas per stage, "
                 f"{result['bandwidth'] or 'unshaped'} per host ({result['device']}, {result.get('dtype', 'fp32')})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""`swarm bench replicas`: what replicas cost and what they buy.

1. tokens/s of the same local swarm with 1, 2 and 3 replicas per stage (side by side, one run
   each): replicas share the step's microbatches and reduce their gradients every step, so
   on one machine, where they share the same cores or GPU, this measures the cost of keeping
   them in step; on separate machines it is the speed-up;
2. failover: a 2-replica swarm in which one replica of stage 1 is killed with SIGKILL in the
   middle of the run; the figure is the seconds from the kill to the first step that completes
   after it (the lost microbatches are re-driven through the other replica).

Writes replicas.json and replicas.png into --out.
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from protocol.spec import preset
from swarm.bench.common.machine import machine_info
from swarm.local import LocalOptions, LocalSwarm, run_local


def run_replicas_bench(out_dir: str, preset_name: str = "small", steps: int = 20, device: str = "cpu",
                       smoke: bool = False) -> dict:
    if smoke:
        preset_name, steps = "tiny", 4
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = preset(preset_name, stages=2 if smoke else None)
    rows = []
    for replicas in ((1, 2) if smoke else (1, 2, 3)):
        m = run_local(LocalOptions(spec, steps=steps, replicas=replicas, device=device, quiet=True))
        rows.append({"replicas": replicas, "tokens_per_second": m["tokens_per_second"], "steps": steps,
                     "final_loss": m["steps"][-1]["loss"]})
        print(f"{replicas} replica(s) per stage: {m['tokens_per_second']:9.0f} tok/s")
    failover = _failover(spec, max(steps, 8), device, out / "failover")
    print(f"failover: {failover['seconds_to_next_step']:.1f} s from the kill to the next completed step "
          f"(step {failover['next_step']}, {failover['attempts']} attempts)")
    result = {"preset": preset_name, "device": device, "devices": [device], "machine": machine_info([device]),
              "runs": rows, "failover": failover,
              "ratios": {f"replicas_{r['replicas']}_over_1": r["tokens_per_second"] / rows[0]["tokens_per_second"]
                         for r in rows}}
    (out / "replicas.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "replicas.png")
    return result


def _failover(spec, steps: int, device: str, workdir: Path) -> dict:
    swarm = LocalSwarm(LocalOptions(spec, steps=steps, replicas=2, device=device, quiet=True, workdir=str(workdir),
                                    extra_peer_args=["--ttl", "6"]))
    try:
        swarm.start()
        kill_after = steps // 2
        deadline = time.monotonic() + 600
        while len(swarm.step_events()[0]) < kill_after:
            swarm._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the swarm did not reach step {kill_after} in 10 minutes; see {workdir}.")
            time.sleep(0.05)  # poll the heads' reports
        victim = dict(swarm.procs)[swarm.peer_name(1, 1)]
        killed_at = time.time()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        swarm.procs = [(n, p) for n, p in swarm.procs if p is not victim]
        records = swarm.follow()
    finally:
        swarm.stop()
    after = next(r for r in records if r["time"] > killed_at)
    return {"killed_at_step": kill_after, "next_step": after["step"], "seconds_to_next_step": after["time"] - killed_at,
            "attempts": after.get("attempts", 1), "typical_step_seconds": sorted(r["seconds"] for r in records)[
                len(records) // 2]}


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    rows = result["runs"]
    ax.bar([str(r["replicas"]) for r in rows], [r["tokens_per_second"] for r in rows])
    ax.set_xlabel("replicas per stage")
    ax.set_ylabel("tokens / s")
    f = result["failover"]
    ax.set_title(f"{result['preset']} on {result['device']}; a replica killed: next step after "
                 f"{f['seconds_to_next_step']:.1f} s", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

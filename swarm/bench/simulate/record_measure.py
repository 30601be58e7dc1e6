"""The measured side of `swarm bench simulate --record-setting`: the public record's swarms, run for real.

Per swarm of `swarm bench record` (swarm/bench/record/bench.py `record_specs` / `swarm_specs`: the `record`
preset, d=1024, 8 stages of 2 layers, 8 microbatches of 8 x 256 tokens, bf16, fixed U; one swarm per codec
and width: dense, subspace k=10, bottleneck b=10, subspace k=64), on the device that measures it:

1. calibration, as `--validate` does it (validate.py `calibrate`): each stage's jobs timed on the project's
   own `StageRunner`s on that device with the threads `swarm local` gives each peer (forward + encode + the
   receiver's decode, the tail's forward-backward, backward, the optimizer step), median of 3 steps after a
   warm-up, right before and right after the swarms, averaged (`before_over_after` says how far they moved);
2. the swarm without link limits (what the simulator's cost per frame is fitted on, never the figure it is
   compared with), then on the record's link (every peer's uplink and downlink shaped by the built-in
   shaper, 200 Mbit/s and 50 ms one-way), each a real `swarm local` (coordinator + a process per stage over
   libp2p, sends in order as `swarm bench record` runs them), `steps` steps, the first untimed:

       tokens/s = sum of tokens / sum of seconds over the steps after the first  (`swarm local`'s figure)
       seconds per step = tokens per step / tokens/s,  median step = the median of those steps' seconds

   and each peer's frame trace summed up as `swarm trace` does (per kind: waiting for its turn on the uplink,
   on the wire, waiting for the reply), to see where a step's time goes when the model and the swarm differ.

Writes OUT/record_measured.json after each swarm (kept if a later one fails); a swarm already in a
measured file that is passed in is not run again.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from protocol.spec import RunSpec
from swarm.bench.common.machine import devices_used, machine_info, per_peer_threads
from swarm.net.frame_trace import read_trace
from swarm.net.trace_report import SUFFIX, peer_times

from .hardware import StageWork
from .validate import _mean, _total, calibrate

BANDWIDTH, LATENCY = "200mbit", "50ms"  # the record's link: Pluralis' ProtocolNanoGPT


def swarm_run(spec: RunSpec, steps: int, device: str, threads: int, bandwidth: str | None, latency: str) -> dict:
    """One real `swarm local` of `spec` (module docstring, 2): its tokens/s, every step's seconds, and where each
    peer's frames spent their time (its frame trace, `swarm trace`'s figures: swarm/net/trace_report.py)."""
    from swarm.local import LocalOptions, run_local

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as traces:
        m = run_local(LocalOptions(spec, steps=steps, bandwidth=bandwidth, latency=latency if bandwidth else "0",
                                   device=device, quiet=True, threads=threads, trace_frames=traces,
                                   extra_peer_args=["--send-order", "fifo"]))
        frames = [asdict(peer_times(path.name.split(".")[0], read_trace(path)))
                  for path in sorted(Path(traces).glob(f"*{SUFFIX}"))]
    timed = [s["seconds"] for s in m["steps"][1:]]
    return {"bandwidth": bandwidth or "unlimited", "latency": latency if bandwidth else "0",
            "tokens_per_second": m["tokens_per_second"], "step_seconds": [s["seconds"] for s in m["steps"]],
            "median_step_s": statistics.median(timed), "mean_step_s": statistics.mean(timed),
            "commit_s": m.get("sync", {}).get("commit_seconds"), "wall_s": time.perf_counter() - t0,
            "peers": [{k: p.get(k) for k in ("stage", "worker_busy_fraction", "uplink_busy_fraction",
                                             "bytes_sent_per_token")} for p in m.get("peers", [])],
            "frames": frames}


def work_of(row: dict) -> StageWork:
    """The calibrated seconds per microbatch of a measured row."""
    c = row["calibration"]
    return StageWork(tuple(c["forward_s"]), tuple(c["backward_s"]), tuple(c["apply_s"]))


def measure_swarm(name: str, spec: RunSpec, steps: int, device: str, repeats: int = 3) -> dict:
    """Calibration before, the unshaped and the shaped swarm, calibration after (module docstring)."""
    threads = per_peer_threads(spec.n_stages + 1)  # as `swarm local` gives each of its processes
    before = calibrate(spec, threads, repeats, device)
    bare = swarm_run(spec, steps, device, threads, None, "0")
    shaped = swarm_run(spec, steps, device, threads, BANDWIDTH, LATENCY)
    after = calibrate(spec, threads, repeats, device)
    work = _mean(before, after)
    row = {"variant": name, "spec": spec.to_dict(), "codec": spec.codec, "rank": spec.rank, "stages": spec.n_stages,
           "microbatches": spec.n_microbatches, "step_tokens": spec.batch_size * spec.seq_len, "steps": steps,
           "threads": threads,
           "calibration": {"forward_s": list(work.forward), "backward_s": list(work.backward),
                           "apply_s": list(work.apply), "before_over_after": _total(before) / _total(after)},
           "unshaped": bare, "shaped": shaped}
    print(f"{name}: calibrated {1e3 * _total(work):.1f} ms of stage jobs a microbatch; unshaped "
          f"{bare['tokens_per_second']:.0f} tok/s, at {BANDWIDTH} {LATENCY} {shaped['tokens_per_second']:.0f} tok/s "
          f"({shaped['median_step_s']:.2f} s a step)", flush=True)
    return row


def measure(specs: dict[str, RunSpec], steps: int, device: str, out: Path, earlier: dict | None = None,
            repeats: int = 3) -> dict:
    """Every swarm of `specs` that `earlier` (a record_measured.json) lacks, measured; the file's content."""
    used = devices_used(device)
    result = earlier or {"device": ",".join(used), "devices": used, "machine": machine_info(used),
                         "cores": os.cpu_count() or 1, "bandwidth": BANDWIDTH, "latency": LATENCY, "swarms": []}
    have = {r["variant"] for r in result["swarms"]}
    for name, spec in specs.items():
        if name in have:
            print(f"{name}: measured earlier ({result['machine']['description']}), not run again")
            continue
        result["swarms"].append(measure_swarm(name, spec, steps, device, repeats))
        result["date"] = time.strftime("%Y-%m-%d")
        out.mkdir(parents=True, exist_ok=True)
        (out / "record_measured.json").write_text(json.dumps(result, indent=1) + "\n")
    return result

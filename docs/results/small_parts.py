"""Where a shaped `small` step's time goes: 3 peers on one GPU, subspace, unshaped and at 80 Mbit/s per host,
at the preset's 4 microbatches a step (8 sequences each) and at 8 and 16 (4 and 2 sequences), 20 steps each,
side by side in one call. Per run: tokens/s, every step's seconds, the commit's mean and parts, and each peer's
bytes per token, worker busy fraction and uplink busy fraction (docs/benchmarks.md "Links busy").

A microbatch's frame is its tokens x 65 B (subspace, bf16 wire): 133 kB at 8 sequences, 13 ms on an 80 Mbit/s
uplink. A synchronous step's first activations cross two links before the last stage starts, and its last
gradients two more after the last stage ends, so the link time no compute hides shrinks with the frame.

Usage (device machine, wheels installed as in docs/results/scale_gpu.sh):
    python docs/results/small_parts.py OUT [MICROBATCH_SIZES, default 8,4,2] [DEVICE, default cuda] [PRESET]
(CPU smoke: python docs/results/small_parts.py /tmp/sp 8 cpu tiny)
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from protocol.spec import preset
from swarm.bench.common.machine import machine_info
from swarm.local import LocalOptions, run_local

out = Path(sys.argv[1])
sizes = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "8,4,2").split(",")]
device, name = (sys.argv[3:] + ["cuda", "small"][len(sys.argv[3:]):])[:2]
out.mkdir(parents=True, exist_ok=True)
path = out / "small-parts.json"
rows = json.loads(path.read_text())["runs"] if path.exists() else []
done = {(r["microbatch_size"], r["bandwidth"]) for r in rows}
for mb in sizes:
    spec = preset(name, codec="subspace", dtype="bf16" if device == "cuda" else None).replace(microbatch_size=mb)
    for link in (None, "80mbit"):
        if (mb, link or "unlimited") in done:
            continue
        m = run_local(LocalOptions(spec, steps=20, bandwidth=link, device=device, quiet=True))
        secs = [s["seconds"] for s in m["steps"][1:]]
        row = {"microbatch_size": mb, "microbatches": spec.n_microbatches, "bandwidth": link or "unlimited",
               "tokens_per_second": m["tokens_per_second"], "median_step_s": statistics.median(secs),
               "step_seconds": [s["seconds"] for s in m["steps"]], "commit_seconds": m["sync"]["commit_seconds"],
               "commit_parts": m["sync"]["commit_parts"],
               "forward_bytes_per_token": m["wire"]["forward_bytes_per_token"],
               "peers": [{k: p.get(k) for k in ("stage", "bytes_sent_per_token", "worker_busy_fraction",
                                                "uplink_busy_fraction")} for p in m["peers"]]}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "step_seconds"}), flush=True)
        path.write_text(json.dumps({"preset": name, "codec": "subspace", "stages": 3, "dtype": "bf16",
                                    "machine": machine_info([device]), "runs": rows}, indent=1) + "\n")

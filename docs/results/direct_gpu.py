"""The direct channel in a GPU pipeline (docs/benchmarks.md "Transport"): `large`, 2 stages, unshaped, both
peers on the devices given, with `--direct on` (frames of 64 KiB and more over plain TCP, the default) and
`--direct off` (everything through the p2pd daemons), side by side in one call, dense and subspace. Per run:
tokens/s, every step's seconds, bytes per token and each peer's frames sent direct.

Usage (device machine, wheels installed as in docs/results/scale_gpu.sh):
    python docs/results/direct_gpu.py OUT [DEVICES, default cuda:0,cuda:0] [STEPS, default 8] [PRESET, default large]
                                      [ROUNDS, default 1]
(ROUNDS > 1 repeats the four runs in turn, interleaved, resuming what OUT already holds.)
(CPU smoke: python docs/results/direct_gpu.py /tmp/dg cpu,cpu 2 tiny)
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from protocol.spec import preset
from swarm.bench.common.machine import machine_info
from swarm.local import LocalOptions, run_local


def measured(codec: str, direct: str, devices: str, steps: int, name: str) -> dict:
    gpu = devices.startswith("cuda")
    spec = preset(name, codec=codec, stages=2, dtype="bf16" if gpu else None)
    m = run_local(LocalOptions(spec, steps=steps, device=devices.split(",")[0], devices=devices, quiet=True,
                               extra_peer_args=["--direct", direct]))
    secs = [s["seconds"] for s in m["steps"][1:]]
    return {"codec": codec, "direct": direct, "tokens_per_second": m["tokens_per_second"],
            "median_step_s": statistics.median(secs), "step_seconds": [s["seconds"] for s in m["steps"]],
            "forward_bytes_per_token": m["wire"]["forward_bytes_per_token"],
            "forward_direct_messages": m["wire"].get("forward_direct_messages"),
            "backward_direct_messages": m["wire"].get("backward_direct_messages"),
            "final_loss": m["steps"][-1]["loss"]}


def main() -> None:
    out = Path(sys.argv[1])
    devices, steps, name, rounds = (sys.argv[2:] + ["cuda:0,cuda:0", "8", "large", "1"][len(sys.argv[2:]):])[:4]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "direct-gpu.json"
    rows = json.loads(path.read_text())["runs"] if path.exists() else []  # resumable: a finished run is kept
    done = {(r["codec"], r["direct"], r.get("round", 1)) for r in rows}
    for round_ in range(1, int(rounds) + 1):
        for codec in ("dense", "subspace"):
            for direct in ("on", "off"):
                if (codec, direct, round_) in done:
                    continue
                rows.append({**measured(codec, direct, devices, int(steps), name), "round": round_})
                write(path, name, devices, rows)


def write(path: Path, name: str, devices: str, rows: list[dict]) -> None:
    row = rows[-1]
    print(json.dumps({k: v for k, v in row.items() if k != "step_seconds"}), flush=True)
    path.write_text(json.dumps({"preset": name, "stages": 2, "devices": devices,
                                "machine": machine_info(devices.split(",")), "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""The runs behind docs/benchmarks.md "Links busy: sends in order": tokens/s against the link roofline, with
each peer's activations and gradients sent in order (fifo, the default) and all at once (shared), side by
side in one call (`swarm bench throughput --send-order fifo,shared`; this script adds what its flags do not
say: `ceiling=False` for dense, whose roofline on these links is the link's alone, and the CPU part's 8
microbatches a step).

Usage (CPU):
    python docs/results/links_busy.py tiny OUT [kernel]           # tiny dense, 2 stages, 8 microbatches, 4 Mbit/s
    python docs/results/links_busy.py tiny-subspace OUT [kernel]  # the same, subspace (with its unshaped ceiling)
Usage (device machine, wheels installed as in docs/results/scale_gpu.sh):
    python docs/results/links_busy.py large-dense OUT     # large, 2 stages on cuda:0,cuda:1, dense
    python docs/results/links_busy.py large-subspace OUT  # the same, subspace (its roofline is compute)
    python docs/results/links_busy.py small OUT           # small, 3 peers on cuda:0, subspace and bottleneck
Usage (one GPU: the same three with "-one-gpu", every stage on cuda:0 and sends in order only):
    python docs/results/links_busy.py large-dense-one-gpu OUT     # (also large-subspace-one-gpu, small-one-gpu)
"""
from __future__ import annotations

import sys

from protocol.spec import preset
from swarm.bench.record.throughput import run_throughput_bench

ON_GPUS = {  # part -> (preset, the call's own settings); each on 80 Mbit/s per host
    "large-dense": ("large", dict(steps=6, latency="20ms", ceiling=False,
                                  variants={"dense": preset("large", codec="dense", dtype="bf16", stages=2)})),
    "large-subspace": ("large", dict(steps=10, latency="20ms", dtype="bf16", stages=2, codecs="subspace")),
    "small": ("small", dict(steps=20, dtype="bf16", codecs="subspace,bottleneck")),  # 3 peers on cuda:0 either way
}

part, out, kernel = sys.argv[1], sys.argv[2], sys.argv[3:] == ["kernel"]
if part == "tiny":  # link-bound on a CPU: 8 microbatches of 262 kB a step, 0.5 s each at 4 Mbit/s
    spec = preset("tiny", codec="dense", stages=2).replace(batch_size=64)
    run_throughput_bench(f"{out}/{part}", "tiny", steps=8, bandwidth="4mbit", latency="20ms", ceiling=False,
                         variants={"dense": spec}, send_orders="fifo,shared", kernel_shaping=kernel)
elif part == "tiny-subspace":  # 33 kB frames: 67 ms on the wire, under 4 round trips of 20 ms each way
    spec = preset("tiny", codec="subspace", stages=2).replace(batch_size=64)
    run_throughput_bench(f"{out}/{part}", "tiny", steps=8, bandwidth="4mbit", latency="20ms",
                         variants={"subspace": spec}, send_orders="fifo,shared", kernel_shaping=kernel)
elif part.removesuffix("-one-gpu") in ON_GPUS:
    one_gpu = part.endswith("-one-gpu")
    name, settings = ON_GPUS[part.removesuffix("-one-gpu")]
    if name == "large":
        settings["devices"] = "cuda:0,cuda:0" if one_gpu else "cuda:0,cuda:1"
    run_throughput_bench(f"{out}/{part}", name, device="cuda", bandwidth="80mbit",
                         send_orders="fifo" if one_gpu else "fifo,shared", **settings)
else:
    raise SystemExit(f"unknown part {part!r}: tiny, tiny-subspace, or one of {', '.join(ON_GPUS)} "
                     "(with -one-gpu or without).")

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
Usage (one GPU: both stages share cuda:0, sends in order only; the rows that re-measure the above on one card):
    python docs/results/links_busy.py large-dense-one-gpu OUT
    python docs/results/links_busy.py large-subspace-one-gpu OUT
    python docs/results/links_busy.py small-fifo OUT
"""
from __future__ import annotations

import sys

from protocol.spec import preset
from swarm.bench.throughput import run_throughput_bench

part, out, kernel = sys.argv[1], sys.argv[2], sys.argv[3:] == ["kernel"]
if part == "tiny":  # link-bound on a CPU: 8 microbatches of 262 kB a step, 0.5 s each at 4 Mbit/s
    spec = preset("tiny", codec="dense", stages=2).replace(batch_size=64)
    run_throughput_bench(f"{out}/{part}", "tiny", steps=8, bandwidth="4mbit", latency="20ms", ceiling=False,
                         variants={"dense": spec}, send_orders="fifo,shared", kernel_shaping=kernel)
elif part == "tiny-subspace":  # 33 kB frames: 67 ms on the wire, under 4 round trips of 20 ms each way
    spec = preset("tiny", codec="subspace", stages=2).replace(batch_size=64)
    run_throughput_bench(f"{out}/{part}", "tiny", steps=8, bandwidth="4mbit", latency="20ms",
                         variants={"subspace": spec}, send_orders="fifo,shared", kernel_shaping=kernel)
elif part.removesuffix("-one-gpu") in ("large-dense", "large-subspace", "small") or part == "small-fifo":
    # "-one-gpu" (and "small-fifo"): the rows re-measured on one card, both stages on cuda:0, sends in order only
    one_gpu = part.endswith("-one-gpu") or part == "small-fifo"
    base = "small" if part.startswith("small") else part.removesuffix("-one-gpu")
    shared = dict(device="cuda", bandwidth="80mbit", send_orders="fifo" if one_gpu else "fifo,shared")
    if base != "small":
        shared.update(latency="20ms", devices="cuda:0,cuda:0" if one_gpu else "cuda:0,cuda:1")
    if base == "large-dense":
        spec = preset("large", codec="dense", dtype="bf16", stages=2)
        run_throughput_bench(f"{out}/{part}", "large", steps=6, ceiling=False, variants={"dense": spec}, **shared)
    elif base == "large-subspace":
        run_throughput_bench(f"{out}/{part}", "large", steps=10, dtype="bf16", stages=2, codecs="subspace", **shared)
    else:
        run_throughput_bench(f"{out}/{part}", "small", steps=20, dtype="bf16", codecs="subspace,bottleneck", **shared)
else:
    raise SystemExit(f"unknown part {part!r}: tiny, tiny-subspace, large-dense, large-subspace, small, "
                     "large-dense-one-gpu, large-subspace-one-gpu or small-fifo.")

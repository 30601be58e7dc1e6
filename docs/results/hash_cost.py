"""What the state hash of a `large` stage costs on a GPU host, part by part (one stage of two:
8 layers of d=2048, weights and both Adam moments, fp32, ~4.8 GB): the hash as peer/runner/state_hash.py
computes it; the device-to-host copies alone (pageable, and into pinned memory); sha256 alone
over host copies on one thread and on the hash's pool. Usage: python docs/results/hash_cost.py OUT.json"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from peer.runner.state_hash import HASH_THREADS, PIECE_BYTES, state_sha256


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(out: str) -> None:
    d, dev = 2048, torch.device("cuda:0")
    shapes = [(d, d)] * 4 + [(4 * d, d), (d, 4 * d)]
    tensors = [torch.randn(s, device=dev) for _ in range(8) for s in shapes for _ in range(3)]
    state = {"module": {str(i): t for i, t in enumerate(tensors)}}
    total = sum(t.numel() * t.element_size() for t in tensors)
    rows = {"bytes": total, "threads": HASH_THREADS, "piece_bytes": PIECE_BYTES, "gpu": torch.cuda.get_device_name(0)}
    state_sha256(state)  # warm
    rows["state_sha256_s"] = min(timed(lambda: state_sha256(state)) for _ in range(2))
    host = []
    rows["d2h_pageable_s"] = timed(lambda: host.extend(t.cpu() for t in tensors))
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    rows["d2h_pinned_s"] = timed(lambda: [p.copy_(t, non_blocking=True) for p, t in zip(pinned, tensors)])
    flat = [h.reshape(-1).view(torch.uint8).numpy() for h in host]
    rows["sha256_one_thread_s"] = timed(lambda: [hashlib.sha256(f).digest() for f in flat])
    pieces = [f[a:a + PIECE_BYTES] for f in flat for a in range(0, len(f), PIECE_BYTES)]
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        rows["sha256_pool_s"] = timed(lambda: list(pool.map(lambda p: hashlib.sha256(p).digest(), pieces)))
    rows["gb_per_s"] = {k[:-2]: total / v / 1e9 for k, v in rows.items() if k.endswith("_s")}
    print(json.dumps(rows, indent=1))
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

"""What the state hash costs on a CPU host against a step (docs/security.md, Vouched state): for the `tiny` and
`small` presets in two stages, one process, one torch thread (as the 2-core test machine runs them), the time of
`state_sha256` over each stage's state as a replica hashes it (`StageRunner.state_dict`: weights, step and both Adam
moments, present after a first step), and the time of a step of both stages (`InProcessPipeline.train_step`, after a
warm one). Hashes: every try of each stage (5 each); steps: 5 for `tiny`, 2 for `small`. On this machine as loaded as
it is (its 1-minute load average is written beside the figures).
Usage: python docs/results/state_hash_cpu.py OUT.json"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from peer.runner.state_hash import HASH_EVERY, state_bytes, state_sha256
from protocol.spec import preset

STEPS = {"tiny": 5, "small": 2}


def measure(name: str) -> dict:
    spec = preset(name, stages=2)
    pipe = InProcessPipeline(spec)
    src = BatchSource(load_corpus(None, seq_len=spec.seq_len), spec.seq_len, spec.microbatch_size,
                      spec.data_seed).microbatch
    pipe.train_step(0, src)  # warm, and the Adam moments exist from here on
    steps = []
    for s in range(1, STEPS[name] + 1):
        t0 = time.perf_counter()
        pipe.train_step(s, src)
        steps.append(time.perf_counter() - t0)
    hashes, sizes = [], []
    for runner in pipe.runners:
        state = runner.state_dict()
        sizes.append(len(state_bytes(state)))
        for _ in range(5):
            t0 = time.perf_counter()
            state_sha256(state)
            hashes.append(time.perf_counter() - t0)
    step = min(steps)
    return {"stage_state_bytes": sizes, "hash_s": hashes, "hash_min_s": min(hashes), "hash_max_s": max(hashes),
            "step_s": steps, "step_min_s": step,
            "both_stages_every_step_pct": 100 * 2 * min(hashes) / step,
            f"both_stages_every_{HASH_EVERY}th_step_pct": 100 * 2 * min(hashes) / step / HASH_EVERY}


def main(out: str) -> None:
    torch.set_num_threads(1)
    rows = {"threads": 1, "cpus": os.cpu_count(), "load_1min_before": os.getloadavg()[0]}
    rows.update({name: measure(name) for name in STEPS})
    rows["load_1min_after"] = os.getloadavg()[0]
    print(json.dumps(rows, indent=1))
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

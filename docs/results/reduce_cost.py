"""What one powersgd reduce of a `large` stage costs on a GPU, part by part, in one process (the
two replicas' exchanges over libp2p are not in it): the share, round 1, the wire (encode and
decode of round 1's contribution), the sums, round 2, the finish, and the apply (the optimizer
step with the agreed gradient). Usage: python docs/results/reduce_cost.py OUT.json [STAGES [PRESET]]
(STAGES: the stage count the model is cut into; stage 0 of it is timed; 1 = the whole model,
as in the 1 x 2 layout of `swarm bench scale`)."""
from __future__ import annotations

import json
import sys
import time

import torch

from peer.runner.reduced import Reduced, sum_contributions, sum_factors
from peer.runner.replica_sync import PowerSync, flat_limits
from peer.runner.stage import StageRunner
from protocol.control import Contribution, decode_reduce, encode_contribution
from protocol.spec import preset


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(rows: dict, name: str, fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    rows[name] = rows.get(name, 0.0) + time.perf_counter() - t0
    return out


def one_reduce(rows: dict, runner: StageRunner, power: PowerSync, step: int) -> None:
    spec, run, n = runner.spec, runner.spec.run_hash, runner.spec.n_microbatches
    for p in runner.params:
        p.grad = torch.randn_like(p) * 1e-3
    runner._backward_done.update(range(n))
    mbs, flat, stat, _ = timed(rows, "share", lambda: runner.share(True))
    first = timed(rows, "round1", lambda: power.first(flat))
    mine = Contribution(run, step, 0, runner.stage, list(range(n // 2)), first.exact, stat, 0, first.P)
    body = timed(rows, "encode1", lambda: encode_contribution(mine))
    theirs = timed(rows, "decode1", lambda: decode_reduce(body, flat_limits(spec, runner)))
    theirs = Contribution(run, step, 0, runner.stage, list(range(n // 2, n)), theirs.grads, theirs.stat, 0,
                          theirs.factors)
    got = {"a": mine, "b": theirs}
    total = timed(rows, "sum1", lambda: sum_contributions(step, 0, got, n))
    P_hat, Q_mine, Q_flat = timed(rows, "round2", lambda: power.second(first, sum_factors(got, runner.dtype)))
    q = Contribution(run, step, 0, runner.stage, [], None, None, 1, Q_flat)
    body2 = timed(rows, "encode2", lambda: encode_contribution(q))
    timed(rows, "decode2", lambda: decode_reduce(body2, flat_limits(spec, runner)))
    Q_sum = timed(rows, "sum2", lambda: sum_factors({"a": q, "b": q}, runner.dtype))
    agreed = timed(rows, "finish", lambda: power.finish((step, 0), first, total.grads, P_hat, Q_mine, Q_sum))
    runner.set_reduced(Reduced(step, 0, agreed, total.stat, total.contributors))
    timed(rows, "apply", lambda: runner.apply_reduced(step, 0))
    power.commit(step, 0)
    rows.setdefault("bytes_round1", len(body))
    rows.setdefault("bytes_round2", len(body2))


def main(out: str, stages: int, name: str = "large") -> None:
    spec = preset(name, stages=stages, codec="subspace", dtype="bf16", replica_sync="powersgd",
                  replica_sync_rank=8)  # as measured
    runner = StageRunner(spec, 0, "cuda:0" if torch.cuda.is_available() else "cpu")
    power = PowerSync(runner)
    one_reduce({}, runner, power, 0)  # warm: allocations, kernels
    rows: dict = {}
    reps = 3
    for i in range(1, reps + 1):
        one_reduce(rows, runner, power, i)
    result = {"preset": name, "stages": stages, "params": runner.n_params, "layout_numel": runner.layout.numel,
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none", "reps": reps,
              "seconds": {k: v / reps for k, v in rows.items() if not k.startswith("bytes")},
              "bytes": {k: v for k, v in rows.items() if k.startswith("bytes")}}
    result["total_s"] = sum(result["seconds"].values())
    print(json.dumps(result, indent=1))
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1, *sys.argv[3:4])

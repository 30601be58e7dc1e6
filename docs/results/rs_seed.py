"""`swarm bench replica-sync`'s loss runs (no speed rows) with the weights and data seeds moved by OFFSET,
so that two seeds can run side by side as two processes.
Usage: rs_seed.py OFFSET STEPS OUT [DEVICE [WARMUPS]]  (WARMUPS: powersgd's exact warm-ups, e.g. 0,100)"""
import sys

import swarm.bench.replicas.replica_sync as bench
from protocol.spec import preset

offset, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


def seeded(name: str, **kw):
    p = preset(name, **kw)
    return p.replace(seed=p.seed + offset, data_seed=p.data_seed + offset)


bench.preset = seeded
bench.run_replica_sync_bench(out, preset_name="small", steps=steps, speed_steps=0, ranks=(8,), bandwidth="80mbit",
                             device=sys.argv[4] if len(sys.argv) > 4 else "cuda", data="stdlib", seeds=1,
                             warmups=tuple(int(w) for w in sys.argv[5].split(",")) if len(sys.argv) > 5 else (0,))

"""powersgd r=8 after WARMUP exact steps, on exactly the spec of the committed 200-step `small` loss runs
(docs/img/replica-sync-gpu-small-200.json: every stage at the lr, as it ran), beside that file's exact and
plain powersgd rows of the same seed: one loss run instead of three (~4 minutes on an H100), so both seeds
fit one device call as two processes.
Usage: rs_warmup.py OFFSET WARMUP OUT_JSON [DEVICE]"""
import json
import sys
from pathlib import Path

import swarm.bench.replicas.replica_sync as bench
from protocol.spec import RunSpec

COMMITTED = Path(__file__).resolve().parent.parent / "img" / "replica-sync-gpu-small-200.json"

offset, warmup, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
device = sys.argv[4] if len(sys.argv) > 4 else "cuda"
committed = json.loads(COMMITTED.read_text())
base = RunSpec.from_dict(committed["train_spec"])
spec = base.replace(seed=base.seed + offset, data_seed=base.data_seed + offset, replica_sync="powersgd",
                    replica_sync_rank=8, replica_sync_warmup=warmup)
row = bench._loss_row(spec, spec.total_steps, device, "stdlib", 16)
same_seed = {r["mode"]: r["held_out_loss"] for r in committed["loss"] if r["seed"] == spec.seed}
row["vs_exact"] = row["held_out_loss"] / same_seed["exact"] - 1
row["committed"] = {mode: {"held_out_loss": loss, "vs_exact": loss / same_seed["exact"] - 1}
                    for mode, loss in same_seed.items()}
row["spec"] = spec.to_dict()
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(row, indent=1) + "\n")
print(f"seed {spec.seed}: {row['mode']}: held-out {row['held_out_loss']:.4f} ({100 * row['vs_exact']:+.2f}% vs exact "
      f"{same_seed['exact']:.4f}; plain r=8 was {100 * row['committed']['powersgd r=8']['vs_exact']:+.2f}%)")

"""`swarm bench replica-sync`'s loss runs one row per process, on the `small` preset's current defaults
(subspace, the stage lr its preset gives), so that rows of several modes and seeds run side by side on one
GPU and a call cut short keeps the rows it finished (an existing row is not run again).

Usage: rs_rows.py OUT_DIR STEPS OFFSET MODE [DEVICE]   one row: OUT_DIR/MODE-seedOFFSET.json
       rs_rows.py summary OUT_DIR OUT_JSON            every row of OUT_DIR, each against exact of its seed and length
MODE: exact, or pR / pRwW (powersgd at rank R, after W exact steps), e.g. p8, p32, p8w100."""
import json
import re
import sys
from pathlib import Path


def spec_for(steps: int, offset: int, mode: str):
    from protocol.spec import preset
    base = preset("small", codec="subspace", total_steps=steps)
    base = base.replace(seed=base.seed + offset, data_seed=base.data_seed + offset)
    if mode == "exact":
        return base
    m = re.fullmatch(r"p(\d+)(?:w(\d+))?", mode)
    if not m:
        raise SystemExit(f"mode {mode!r} is neither 'exact' nor pR / pRwW (e.g. p8, p8w100)")
    return base.replace(replica_sync="powersgd", replica_sync_rank=int(m[1]), replica_sync_warmup=int(m[2] or 0))


def one_row(out: Path, steps: int, offset: int, mode: str, device: str) -> None:
    path = out / f"{mode}-seed{offset}.json"
    if path.exists():
        print(f"{path} exists: kept")
        return
    import swarm.bench.replica_sync as bench
    spec = spec_for(steps, offset, mode)
    row = bench._loss_row(spec, steps, device, "stdlib", 16)
    row["spec"] = spec.to_dict()
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row, indent=1) + "\n")
    print(f"{mode} seed {offset}: held-out {row['held_out_loss']:.4f} ({row['seconds']:.0f} s)", flush=True)


def summary(out: Path, target: Path) -> None:
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*-seed*.json"))]
    exact = {(r["seed"], r["steps"]): r["held_out_loss"] for r in rows if r["mode"] == "exact"}
    for r in rows:
        same = exact.get((r["seed"], r["steps"]))
        r["vs_exact"] = None if same is None else r["held_out_loss"] / same - 1
        gap = "" if same is None else f" ({100 * r['vs_exact']:+.2f}% vs exact)"
        print(f"{r['mode']:>32} seed {r['seed']}, {r['steps']} steps: {r['held_out_loss']:.4f}{gap}")
    target.write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "summary":
        summary(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        one_row(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                sys.argv[5] if len(sys.argv) > 5 else "cuda")

"""`swarm bench replica-sync`'s loss runs one row per process, on the `small` preset's current defaults
(subspace, the stage lr its preset gives), so that rows of several modes and seeds run side by side on one
GPU and a call cut short keeps the rows it finished (an existing row is not run again).

Usage: rs_rows.py OUT_DIR STEPS OFFSET MODE [DEVICE]   one row: OUT_DIR/MODE-seedOFFSET.json
       rs_rows.py summary OUT_DIR OUT_JSON            every row of OUT_DIR, each against exact of its seed and length
       rs_rows.py plot OUT_PNG SUMMARY_JSON...        the gap against the rank, per length, from those summaries
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
    import swarm.bench.replicas.replica_sync as bench
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


def plot(target: Path, summaries: list[Path]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for f in summaries for r in json.loads(f.read_text())["rows"] if r.get("vs_exact") is not None]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for steps in sorted({r["steps"] for r in rows}):
        plain = [r for r in rows if r["steps"] == steps and r["mode"].startswith("powersgd")
                 and "exact steps" not in r["mode"]]
        ranks = sorted({r["spec"]["replica_sync_rank"] for r in plain})
        means = [100 * sum(r["vs_exact"] for r in plain if r["spec"]["replica_sync_rank"] == k)
                 / sum(1 for r in plain if r["spec"]["replica_sync_rank"] == k) for k in ranks]
        ax.plot(ranks, means, "o-", label=f"{steps} steps (mean over seeds)")
        for r in plain:
            ax.plot(r["spec"]["replica_sync_rank"], 100 * r["vs_exact"], ".", color="grey")
    ax.axhline(2, ls=":", color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("powersgd rank r")
    ax.set_ylabel("held-out loss over exact (%)")
    ax.set_title("small, 2 replicas a stage, one H200: the gap against the rank", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(target, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    if sys.argv[1] == "plot":
        plot(Path(sys.argv[2]), [Path(a) for a in sys.argv[3:]])
    elif sys.argv[1] == "summary":
        summary(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        one_row(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                sys.argv[5] if len(sys.argv) > 5 else "cuda")

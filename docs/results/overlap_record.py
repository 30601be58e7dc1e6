"""Issue 54 item 3: what overlapping consecutive steps (one-step-stale weights) buys in the record's setting.

GPU command for the lead (one H100, one call, ~6 min expected): the sync curves the published record already
trained with this exact spec are reused (`--reuse`: dense 396 steps, seeds 0 and 1; subspace 16x 495 steps, seed
1), so 5 curves train at once, all 495 steps (seed 0: dense stale1, 16x sync, 16x stale1; seed 1: dense stale1,
16x stale1), one process per seed (`--concurrent`). Five record jobs shared one H100 at ~0.65 s a step each
(docs/img/record-gpu-h100-convergence.json: 239-279 s for 396 steps), so ~330 s + start-up, under the 540 s:

    PYTHONPATH=. python3 docs/results/overlap_record.py OUT --device cuda --seeds 0,1 --reuse --concurrent \
        --sim docs/results/overlap_record_sim_20261207/overlap_sim.json

Without --reuse all 8 curves train (two calls: `--seeds 0`, then `--seeds 0,1`, ~6 min each; the second keeps
OUT's seed-0 curves). Curves already in OUT/seed<k>/convergence.json with the same spec and schedule are kept.

CPU smoke (tiny, 3 stages, 120 / 150 steps; ~5 min on 2 cores; NOT the record setting):
    PYTHONPATH=. python3 docs/results/overlap_record.py OUT --smoke
Simulation alone (seconds; what --sim reads): PYTHONPATH=. python3 docs/results/overlap_record.py OUT --sim-only

Two halves, combined:

1. loss per step, in process (swarm/bench/record/convergence.py `train_curves`, the record bench's trainer), per
   seed: dense and subspace 16x (stage lr x0.03), each "sync" (today's step) and "stale1" (PipeDream-2BW,
   peer/runner/pipeline.py: W_{t+1} = W_t - update_t(grad f(W_{t-1}; batch_t))). Dense sync trains the record's
   6.5M tokens (its final held-out loss L* is the target); the other three `--longer` x that (own lr schedule),
   so that a slower curve can still reach L*.
2. seconds per step, simulated (swarm/bench/simulate/overlap.py) with record_setting.py's calibration: the
   measured H100 swarms of docs/results/simulate_record_h100_20261207 (run1, run2: each stage's seconds per
   microbatch and the swarm's fitted cost per frame), 8 stages, 200 Mbit/s, 50 ms; sync and overlapped, steady
   state over `SIM_STEPS` steps, the mean of the two calibrations.

Per seed, codec c and schedule s:

    steps_to(c, s)   = first step at which the held-out curve reaches L* (interpolated)
    seconds_to(c, s) = steps_to(c, s) x seconds_per_step(c, s)
    x_sooner         = seconds_to(dense, sync) / seconds_to(c, s)

Writes OUT/overlap_record.json and OUT/overlap_record.png (held-out loss against predicted hours).
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
CALIBRATIONS = [HERE / "simulate_record_h100_20261207" / r for r in ("run1", "run2")]
SIM_STEPS = 65  # 64 intervals: the overlapped schedule commits in pairs, an even count averages them alike
CODECS = {"dense": "dense", "subspace-16x-lr0.03": "subspace-16x"}  # curve variant -> its swarm
SCHEDULES = {"sync": "sync", "stale1": "overlap"}  # in-process schedule -> simulator schedule
RECORD_TOKENS = 6_500_000
# the published record's sync curves, by seed (docs/benchmarks.md "The public record's setting"), for --reuse
REUSE = {0: ["record-gpu-h100-convergence.json"],
         1: ["record-gpu-h100-seed1-convergence.json", "record-gpu-h100-seed1-125-convergence.json"]}


def simulate_steps() -> dict:
    """Seconds per step of each swarm, sync and overlapped, per calibration and their mean (module docstring, 2)."""
    from protocol.spec import RunSpec
    from swarm.bench.simulate.overlap import busiest_resource_s
    from swarm.bench.simulate.record_measure import work_of
    from swarm.bench.simulate.validate import Case, _wire_bytes, simulated

    out: dict = {"calibrations": [str(c.relative_to(HERE)) for c in CALIBRATIONS], "steps": SIM_STEPS, "swarms": {}}
    for cal in CALIBRATIONS:
        measured = json.loads((cal / "record_measured.json").read_text())
        fitted = {c["variant"]: c["fitted_frame_s"] for c in json.loads((cal / "simulate_record.json").read_text())
                  ["cases"]}
        for row in measured["swarms"]:
            if row["variant"] not in CODECS.values():
                continue
            spec, work = RunSpec.from_dict(row["spec"]), work_of(row)
            case = Case(spec.codec, 1, measured["bandwidth"], measured["latency"])
            per = {"measured_sync_s": row["step_tokens"] / row["shaped"]["tokens_per_second"],
                   "fitted_frame_s": fitted[row["variant"]],
                   "bound": busiest_resource_s(work, _wire_bytes(spec), spec.n_microbatches, 200e6)}
            for sched in SCHEDULES.values():
                sim = simulated(spec, work, case, SIM_STEPS, measured["cores"], fitted[row["variant"]], sched)
                per[sched] = row["step_tokens"] / sim["tokens_per_second"]
            out["swarms"].setdefault(row["variant"], {"runs": []})["runs"].append(per)
    for s in out["swarms"].values():
        for key in ("sync", "overlap", "measured_sync_s"):
            s[key] = statistics.mean(r[key] for r in s["runs"])
        s["overlap_speedup"] = s["sync"] / s["overlap"]
    return out


def _specs(seed: int, tokens: int, longer: float, smoke: bool) -> tuple[dict, dict]:
    from swarm.bench.record.bench import record_specs

    specs = record_specs(tokens, smoke, codec_tokens=longer, variants=tuple(CODECS))
    variants, schedules = {}, {}
    for codec, spec in specs.items():
        spec = spec.replace(seed=seed)
        long_steps = max(2, round(specs["dense"].total_steps * longer))
        for sched in SCHEDULES:
            name = codec if sched == "sync" else f"{codec} {sched}"
            variants[name] = spec if (codec, sched) == ("dense", "sync") else spec.replace(total_steps=long_steps)
            schedules[name] = sched
    return variants, schedules


def train(out: Path, seed: int, tokens: int, longer: float, smoke: bool, device: str, reuse: bool = False) -> dict:
    """The seed's four curves, training only those OUT/seed<k>/convergence.json (and with `reuse`, the published
    record's convergence JSONs of `REUSE`) lack with the same spec and schedule."""
    from protocol.spec import RunSpec
    from swarm.bench.record.convergence import train_curves

    variants, schedules = _specs(seed, tokens, longer, smoke)
    folder = out / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    path, done = folder / "convergence.json", {}
    sources = ([HERE.parent / "img" / f for f in REUSE.get(seed, [])] if reuse and not smoke else []) + [path]
    for src in (p for p in sources if p.is_file()):
        old = json.loads(src.read_text())["curves"]
        done.update({n: c for n, c in old.items() if n in variants and RunSpec.from_dict(c["spec"]) == variants[n]
                     and c.get("schedule", "sync") == schedules[n]})
    todo = {n: s for n, s in variants.items() if n not in done}
    if not todo:
        print(f"seed {seed}: every curve trained earlier ({path})")
        return done
    every = max(1, variants["dense"].total_steps // 20)
    res = train_curves(folder, variants["dense"].name, todo, "stdlib", device, every, 4 if smoke else 16,
                       parallel=None if device.startswith("cuda") else False, done=done, schedules=schedules)
    return res["curves"]


def combine(curves_by_seed: dict[int, dict], sim: dict) -> dict:
    """Time to dense-sync's final loss per seed, codec and schedule (module docstring)."""
    from swarm.bench.record.time_to_loss import seconds_to

    rows = {}
    for seed, curves in curves_by_seed.items():
        target = curves["dense"]["val"][-1][1]
        per_seed = {}
        for name, c in curves.items():
            codec, _, sched = name.partition(" ")
            sched = sched or "sync"
            per_step = c["spec"]["batch_size"] * c["spec"]["seq_len"]
            step_s = sim["swarms"][CODECS[codec]][SCHEDULES[sched]]
            tokens = seconds_to(c["val"], target)
            steps = None if tokens is None else tokens / per_step
            per_seed[name] = {"codec": codec, "schedule": sched, "final_val": c["val"][-1][1],
                              "steps_trained": c["spec"]["total_steps"], "seconds_per_step": step_s,
                              "steps_to_target": steps, "seconds_to_target": None if steps is None else steps * step_s}
        dense = per_seed["dense"]["seconds_to_target"]
        for r in per_seed.values():
            t = r["seconds_to_target"]
            r["x_sooner_than_dense_sync"] = None if t is None else dense / t
            if t is None:  # the most it could be, had it reached L* right after its last step
                r["x_sooner_at_most"] = dense / (r["steps_trained"] * r["seconds_per_step"])
        rows[seed] = {"target_loss": target, "curves": per_seed}
    return rows


def _plot(result: dict, curves_by_seed: dict[int, dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(curves_by_seed)
    fig, axes = plt.subplots(1, len(seeds), figsize=(6.5 * len(seeds), 4.4), squeeze=False)
    for ax, seed in zip(axes[0], seeds):
        res = result["seeds"][seed]
        for name, c in curves_by_seed[seed].items():
            r = res["curves"][name]
            per_step = c["spec"]["batch_size"] * c["spec"]["seq_len"]
            hours = [tok / per_step * r["seconds_per_step"] / 3600 for tok, _ in c["val"]]
            x = r["x_sooner_than_dense_sync"]
            label = f"{name} ({r['seconds_per_step']:.2f} s/step" + (f", {x:.2f}x sooner)" if x else ", not reached)")
            ax.plot(hours, [v for _, v in c["val"]], marker=".", label=label,
                    linestyle="--" if r["schedule"] == "stale1" else "-")
        ax.axhline(res["target_loss"], color="gray", linestyle=":", linewidth=1, label="dense sync's final loss")
        ax.set_xscale("log")
        ax.set_xlabel("predicted hours at 200 Mbit/s, 50 ms (simulator, H100 calibration)")
        ax.set_ylabel("held-out loss (nats/byte)")
        ax.set_title(f"{result['label']}, seed {seed}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _train_concurrently(argv: list[str], out: Path, seeds: list[int]) -> None:
    """Each seed's curves in a process of its own (this script, --train-only), all at once; logs in OUT."""
    import subprocess

    rest = [x for i, x in enumerate(argv) if x != "--concurrent" and not (i and argv[i - 1] == "--seeds")
            and x != "--seeds"]
    procs = []
    for k in seeds:
        log = (out / f"seed{k}.log").open("w")
        procs.append((k, log, subprocess.Popen([sys.executable, __file__, *rest, "--seeds", str(k), "--train-only"],
                                               stdout=log, stderr=subprocess.STDOUT)))
    for k, log, proc in procs:
        if proc.wait():
            raise SystemExit(f"seed {k}'s training failed: see {out / f'seed{k}.log'}")
        log.close()


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seeds", default="0,1", help="comma-separated; curves already in OUT/seed<k> are kept")
    ap.add_argument("--tokens", type=int, default=RECORD_TOKENS, help="dense sync's tokens (smoke: 120 steps)")
    ap.add_argument("--longer", type=float, default=1.25, help="the other curves' tokens over dense sync's")
    ap.add_argument("--smoke", action="store_true", help="tiny preset, 3 stages, fp32: a CPU check of the code")
    ap.add_argument("--sim", type=Path, help="an overlap_sim.json to read instead of simulating")
    ap.add_argument("--sim-only", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="keep the published record's sync curves (REUSE)")
    ap.add_argument("--concurrent", action="store_true", help="train the seeds at once, a process each")
    ap.add_argument("--train-only", action="store_true", help=argparse.SUPPRESS)  # one seed of --concurrent
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    seeds = [int(k) for k in a.seeds.split(",")]
    tokens = 120 * 1024 if a.smoke else a.tokens  # tiny: 1,024 tokens a step
    if a.train_only:
        train(a.out, seeds[0], tokens, a.longer, a.smoke, a.device, a.reuse)
        return
    if a.concurrent and len(seeds) > 1:
        _train_concurrently(argv, a.out, seeds)
    sim = json.loads(a.sim.read_text()) if a.sim else simulate_steps()
    (a.out / "overlap_sim.json").write_text(json.dumps(sim, indent=1) + "\n")
    for name, s in sim["swarms"].items():
        print(f"{name:>14}: sync {s['sync']:.3f} s/step (measured {s['measured_sync_s']:.3f}), overlapped "
              f"{s['overlap']:.3f} s/step: {s['overlap_speedup']:.2f}x")
    if a.sim_only:
        return
    curves = {k: train(a.out, k, tokens, a.longer, a.smoke, a.device, a.reuse) for k in seeds}
    label = ("CPU smoke (tiny, 3 stages, fp32): NOT the record setting; step times are the record setting's"
             if a.smoke else "record preset (d=1024, 8 stages), bf16")
    result = {"label": label, "device": a.device, "tokens_dense_sync": tokens, "longer": a.longer,
              "simulation": sim, "seeds": combine(curves, sim)}
    (a.out / "overlap_record.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, curves, a.out / "overlap_record.png")
    for seed, res in result["seeds"].items():
        print(f"seed {seed}: target {res['target_loss']:.4f}")
        for name, r in res["curves"].items():
            x = r["x_sooner_than_dense_sync"]
            steps = f"{r['steps_to_target']:.0f} steps" if r["steps_to_target"] is not None else "not reached"
            print(f"  {name:>28}: final {r['final_val']:.4f}, {steps} x {r['seconds_per_step']:.3f} s -> "
                  + (f"{r['seconds_to_target'] / 3600:.3f} h, {x:.2f}x sooner than dense sync" if x else
                     f"at most {r['x_sooner_at_most']:.2f}x sooner"))


if __name__ == "__main__":  # the GPU's training processes are spawned: they import this file again
    main(sys.argv[1:])

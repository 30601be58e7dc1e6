"""`swarm bench simulate --record-setting`: the simulator's prediction for the public record's setting (8 stages,
200 Mbit/s, 50 ms) beside the measured swarm, per codec.

The measured side is record_measure.py (each swarm of `swarm bench record`, calibrated and run for real on one
machine, unshaped and on the record's link). For each, the simulator is configured as that machine: one peer a
stage (8), each a worker that runs the stage's calibrated seconds per microbatch, every worker on the machine's
cores (`SharedCores`, as `--validate` does; 8 peers on 16 cores: none waits for a core), the record's link on
every host (`HomeLink`, 200 Mbit/s up and down, 50 ms one-way), the spec's real message bytes, the same steps,
the first untimed. Two predictions, both of the shaped swarm:

- plain: the model alone, no cost per frame;
- calibrated (the one reported): the swarm's own cost per frame fitted as `--validate` fits it (validate.py
  `fitted_frame_s`: the per-frame delay at which the simulated *unshaped* median step equals the measured
  unshaped swarm's), then the shaped swarm simulated with it. The fit sees neither the link nor the figure that
  the prediction is compared with.

Per swarm:

    predicted seconds per step = tokens per step / predicted tokens/s
    ratio = predicted tokens/s / measured tokens/s  (= measured seconds per step / predicted)
    within = |ratio - 1| <= 0.15

and, given `published` (a `swarm bench record` throughput.json of this setting, e.g. the headline's), the same
ratio against its tokens/s on that link. Writes simulate_record.json and simulate_record.png into --out.
"""
from __future__ import annotations

import json
from pathlib import Path

from protocol.spec import RunSpec
from swarm.bench.record.time_to_loss import variant_of

from .record_measure import BANDWIDTH, LATENCY, measure, work_of
from .validate import Case, fitted_frame_s, simulated

TOLERANCE = 0.15
TOKENS = 6_500_000  # what `swarm bench record` trains in the headline's run: only its lr schedule's length


def predict(row: dict, cores: int) -> dict:
    """The plain and the calibrated prediction for one measured swarm (module docstring)."""
    spec, work, steps = RunSpec.from_dict(row["spec"]), work_of(row), row["steps"]
    case = Case(spec.codec, 1, row.get("bandwidth", BANDWIDTH), row.get("latency", LATENCY))
    frame_s = fitted_frame_s(spec, work, case, steps, cores, row["unshaped"]["median_step_s"], high_s=1.0)
    bare = simulated(spec, work, Case(spec.codec, 1, "unlimited", "0"), steps, cores, frame_s)
    plain = simulated(spec, work, case, steps, cores)
    calibrated = simulated(spec, work, case, steps, cores, frame_s)
    return {"fitted_frame_s": frame_s, "unshaped_simulated_median_step_s": bare["median_step_s"],
            "plain": _figures(plain, row["step_tokens"]), "calibrated": _figures(calibrated, row["step_tokens"])}


def _figures(sim: dict, step_tokens: int) -> dict:
    tps = sim["tokens_per_second"]
    return {"tokens_per_second": tps, "seconds_per_step": step_tokens / max(tps, 1e-9),
            "median_step_s": sim["median_step_s"], "microbatch_s": sim["median_microbatch_s"],
            "commit_s": sim["median_commit_s"]}


def _ratio(predicted: float, measured: float) -> dict:
    ratio = predicted / max(measured, 1e-9)
    return {"ratio": ratio, "within": abs(ratio - 1) <= TOLERANCE}


def published_rates(path: str | None, bandwidth: str = BANDWIDTH) -> dict[str, float]:
    """Tokens/s per swarm on the record's link in a `swarm bench record` throughput.json ({} without one)."""
    if not path:
        return {}
    runs = json.loads(Path(path).read_text())["runs"]
    return {variant_of(r): r["tokens_per_second"] for r in runs if r["bandwidth"] == bandwidth
            and r["shaping"] == "builtin"}


def compare(measured: dict, published: dict[str, float], published_path: str | None = None) -> dict:
    """Every measured swarm beside its predictions (module docstring): the JSON written."""
    cases = []
    for row in measured["swarms"]:
        p = predict(row, measured["cores"])
        real = row["shaped"]
        case = {"variant": row["variant"], "codec": row["codec"], "rank": row["rank"],
                "measured": {"tokens_per_second": real["tokens_per_second"],
                             "seconds_per_step": row["step_tokens"] / real["tokens_per_second"],
                             "median_step_s": real["median_step_s"], "commit_s": real["commit_s"]},
                "predicted": p["calibrated"], "predicted_plain": p["plain"],
                **_ratio(p["calibrated"]["tokens_per_second"], real["tokens_per_second"]),
                "plain_ratio": p["plain"]["tokens_per_second"] / real["tokens_per_second"],
                "fitted_frame_s": p["fitted_frame_s"],
                "unshaped": {"measured_median_step_s": row["unshaped"]["median_step_s"],
                             "measured_tokens_per_second": row["unshaped"]["tokens_per_second"],
                             "simulated_median_step_s": p["unshaped_simulated_median_step_s"]},
                "calibration_before_over_after": row["calibration"]["before_over_after"]}
        if row["variant"] in published:  # the same swarm (`swarm_of`: its codec at its width), measured then
            rate = published[row["variant"]]
            case["published"] = {"tokens_per_second": rate, **_ratio(p["calibrated"]["tokens_per_second"], rate)}
        cases.append(case)
        _say(case)
    within = sum(c["within"] for c in cases)
    first = measured["swarms"][0] if measured["swarms"] else {"spec": {}, "stages": None}
    return {"setting": {"preset": first["spec"].get("name"), "stages": first["stages"],
                        "bandwidth": measured["bandwidth"], "latency": measured["latency"], "tolerance": TOLERANCE},
            "device": measured["device"], "devices": measured["devices"], "machine": measured["machine"],
            "measured_date": measured.get("date"), "published_from": published_path, "cases": cases,
            "within": f"{within} of {len(cases)}"}


def _say(c: dict) -> None:
    m, p = c["measured"], c["predicted"]
    extra = f"; published {c['published']['tokens_per_second']:.0f} (x{c['published']['ratio']:.2f})" \
        if "published" in c else ""
    print(f"{c['variant']:>20}: measured {m['tokens_per_second']:7.0f} tok/s ({m['seconds_per_step']:.2f} s a step), "
          f"predicted {p['tokens_per_second']:7.0f} ({p['seconds_per_step']:.2f} s), x{c['ratio']:.2f} "
          f"{'within' if c['within'] else 'NOT within'} 15%; plain model x{c['plain_ratio']:.2f}, fitted "
          f"{1e3 * c['fitted_frame_s']:.1f} ms a frame{extra}", flush=True)


def run_record_setting(out_dir: str, device: str = "cpu", steps: int = 8, variants: tuple[str, ...] | None = None,
                       measured_path: str | None = None, published_path: str | None = None,
                       smoke: bool = False) -> dict:
    """Measure what `measured_path` lacks (record_measure.py), predict, compare; writes the JSON and the PNG."""
    from swarm.bench.record.bench import record_specs, swarm_specs

    if smoke:
        steps = min(steps, 3)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = swarm_specs(record_specs(TOKENS, smoke, variants=variants))  # one swarm per codec and width
    earlier = json.loads(Path(measured_path).read_text()) if measured_path else None
    measured = measure(specs, steps, device, out, earlier, repeats=1 if smoke else 3)
    measured = {**measured, "swarms": [r for r in measured["swarms"] if r["variant"] in specs]}
    result = compare(measured, published_rates(published_path), published_path)
    (out / "simulate_record.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "simulate_record.png")
    print(f"the simulator within {TOLERANCE:.0%} of the measured swarm: {result['within']}")
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = result["cases"]
    bars = [("measured swarm", lambda c: c["measured"]["tokens_per_second"]),
            ("predicted (cost per frame fitted unshaped)", lambda c: c["predicted"]["tokens_per_second"]),
            ("plain model", lambda c: c["predicted_plain"]["tokens_per_second"])]
    if any("published" in c for c in cases):
        bars.insert(1, ("published run (--published)", lambda c: c.get("published", {}).get("tokens_per_second", 0)))
    fig, ax = plt.subplots(figsize=(9, 4.4))
    width = 0.8 / len(bars)
    for i, (label, value) in enumerate(bars):
        xs = [x + (i - (len(bars) - 1) / 2) * width for x in range(len(cases))]
        ax.bar(xs, [value(c) for c in cases], width, label=label)
    for x, c in enumerate(cases):
        top = max(value(c) for _, value in bars)
        ax.text(x, top, f"predicted / measured\nx{c['ratio']:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(cases)), [c["variant"] for c in cases], fontsize=8)
    ax.set_ylabel("tokens / s")
    s = result["setting"]
    ax.set_title(f"{s['preset']}, {s['stages']} stages, {s['bandwidth']}, {s['latency']}: the simulator within "
                 f"{s['tolerance']:.0%} of the swarm in {result['within']}\nmeasured {result['measured_date']} on "
                 f"{result['machine']['description']}", fontsize=8)
    ax.margins(y=0.15)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

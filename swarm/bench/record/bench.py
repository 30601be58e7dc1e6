"""`swarm bench record`: the public record on slow links, in its own setting, on our data.

The record: Pluralis' ProtocolNanoGPT (`RECORD` below), a ~203M model, d=1024, 8 stages,
200 Mbit/s and 50 ms per link, a fixed random projection at rank 160 (6.4x): 5.05x faster per
step than dense, 3.1x more steps, so 1.62x sooner to the target loss. Here: the `record`
preset (the same shape with our byte tokenizer; k = d/100, ~100x), dense, subspace, bottleneck
and subspace with the constrained stages at 0.03 x the lr at ~100x and at 16x (`VARIANTS`,
variants.py; variants that differ only in the lr share one swarm, `swarm_of`), composed
from two benches whose JSONs stay in the output folder:

- loss per token: `convergence.train_curves` trains the three side by side to the token
  budget (same data and seeds) -> OUT/convergence.json;
- tokens/s: `throughput.run_throughput_bench`, a real local swarm (a process per stage) per
  codec on the built-in shaper's link -> OUT/throughput.json.

`--resume` keeps each curve trained with the asked spec and each swarm's rows on the asked link,
and runs only the rest; `--smoke`: `SMOKE_VARIANTS` on `tiny` (16 steps), the shaped link only (no
unshaped ceiling runs: two swarms). With both parts, per codec c
(`record_figures`), for the target L* = dense's final held-out loss:

  tokens_to(c)  = the first tokens at which c's held-out curve reaches L* (interpolated)
  steps(c)      = tokens_to(c) / tokens_per_step
  seconds(c)    = tokens_to(c) / tokens_per_second(c)
  x_sooner(c)   = seconds(dense) / seconds(c) = speed_ratio(c) / steps_ratio(c), with
  speed_ratio   = tokens_per_second(c) / tokens_per_second(dense) (the record's "per step")
  steps_ratio   = steps(c) / steps(dense)

and the same against the highest final loss of the three (which each reaches). Writes
record.json and record.png (held-out loss against wall-clock hours).
"""
from __future__ import annotations

import json
from pathlib import Path

from peer.runner.memory_estimate import estimate_stage
from protocol.spec import RunSpec, preset

from .convergence import train_curves
from .throughput import merge_throughput, run_throughput_bench
from .time_to_loss import seconds_to, time_to_loss, variant_of
from .variants import DEFAULT_VARIANTS, SMOKE_VARIANTS, VARIANTS, check_variants, swarm_of

RECORD = {"name": "Pluralis ProtocolNanoGPT", "parameters": 203e6, "d_model": 1024, "stages": 8,
          "bandwidth": "200mbit", "latency": "50ms", "codec": "fixed random projection, rank 160 (6.4x)",
          "speed_ratio": 5.05, "steps_ratio": 3.1, "x_sooner": 1.62}
PARTS = ("curves", "throughput")


def record_specs(tokens: int, smoke: bool = False, codec_tokens: float = 1.0,
                 variants: tuple[str, ...] | None = None) -> dict[str, RunSpec]:
    """The `variants` (default: `DEFAULT_VARIANTS`; smoke: `SMOKE_VARIANTS`) on the `record` preset, bf16 (smoke:
    `tiny`, fp32), fixed U, dense trained for `tokens` and the others for `codec_tokens` x that."""
    base = preset("tiny", stages=3, basis_updates=False) if smoke else \
        preset("record", dtype="bf16", basis_updates=False)
    names = check_variants(variants or (SMOKE_VARIANTS if smoke else DEFAULT_VARIANTS))
    per_step = base.batch_size * base.seq_len
    steps = max(2, tokens // per_step)
    specs = {}
    for name in names:
        v = dict(VARIANTS[name])
        ratio = v.pop("ratio", None)
        total = steps if name == "dense" else max(2, round(steps * codec_tokens))
        spec = base.with_codec(v.pop("codec"), **v, total_steps=total)
        specs[name] = spec.replace(rank=max(1, base.d_model // ratio)) if ratio else spec
    return specs


def swarm_specs(specs: dict[str, RunSpec]) -> dict[str, RunSpec]:
    """One swarm per distinct `swarm_of`, in the variants' order."""
    out: dict[str, RunSpec] = {}
    for name, spec in specs.items():
        out.setdefault(swarm_of(name), spec)
    return out


def shape(spec: RunSpec) -> dict:
    """The model the bench trains, as the JSON states it: shape, parameters, codec widths."""
    params = sum(estimate_stage(spec, s).params for s in range(spec.n_stages))
    return {"preset": spec.name, "d_model": spec.d_model, "n_layers": spec.n_layers, "n_heads": spec.n_heads,
            "d_ff": spec.d_ff, "stages": spec.n_stages, "stage_layers": list(spec.stage_layers),
            "seq_len": spec.seq_len, "batch_size": spec.batch_size, "microbatch_size": spec.microbatch_size,
            "tokens_per_step": spec.batch_size * spec.seq_len, "parameters": params, "vocab": spec.vocab,
            "tokenizer": f"bytes (vocab {spec.vocab})", "rank": spec.rank,
            "compression": spec.d_model / spec.rank, "wire_dtype": spec.wire_dtype, "dtype": spec.dtype,
            "lr": spec.lr, "warmup_steps": spec.warmup_steps}


def record_figures(curves: dict, tokens_per_second: dict[str, float], target: float) -> dict[str, dict]:
    """Per codec, against dense: tokens, steps and seconds to `target` and the ratios of the module
    docstring (None where a curve never reaches it). `curves`: convergence.json's, by codec."""
    rows = {}
    for name, c in curves.items():
        per_step = c["spec"]["batch_size"] * c["spec"]["seq_len"]
        tokens = seconds_to(c["val"], target)  # the curve is in tokens, so this is tokens to the target
        tps = tokens_per_second[name]
        rows[name] = {"tokens_per_second": tps, "tokens_per_step": per_step, "final_val": c["val"][-1][1],
                      "tokens_trained": c["val"][-1][0], "tokens_to_target": tokens,
                      "steps_to_target": None if tokens is None else tokens / per_step,
                      "seconds_to_target": None if tokens is None else tokens / tps}
    dense = rows["dense"]
    for r in rows.values():
        r["speed_ratio"] = r["tokens_per_second"] / dense["tokens_per_second"]
        reached = r["steps_to_target"] is not None and dense["steps_to_target"] is not None
        r["steps_ratio"] = r["steps_to_target"] / dense["steps_to_target"] if reached else None
        r["x_sooner"] = dense["seconds_to_target"] / r["seconds_to_target"] if reached else None
        if not reached:  # the most it could be: had it reached the target right after its last step
            r["x_sooner_at_most"] = dense["seconds_to_target"] / (r["tokens_trained"] / r["tokens_per_second"])
    return rows


def combine(convergence: dict, throughput: dict, bandwidth: str, specs: dict[str, RunSpec]) -> dict:
    """record.json's content from the two parts' JSONs."""
    curves = {name: convergence["curves"][name] for name in specs}
    convergence = {**convergence, "curves": curves}
    ttl = time_to_loss(convergence, throughput, bandwidth, swarm_of={name: swarm_of(name) for name in specs})
    tps = {name: c["tokens_per_second"] for name, c in ttl["curves"].items()}
    dense_final = curves["dense"]["val"][-1][1]
    swarms = set(swarm_specs(specs))
    rows = [r for r in throughput["runs"] if r["bandwidth"] == bandwidth and r["shaping"] == "builtin"
            and variant_of(r) in swarms]
    link = {variant_of(r): {"tokens_per_second": r["tokens_per_second"],
                         "roofline_tokens_per_second": r["roofline_tokens_per_second"],
                         "forward_bytes_per_token": r["forward_bytes_per_token"],
                         "wire_compression": r["dense_forward_bytes_per_token"] / r["forward_bytes_per_token"],
                         "max_peer_bytes_sent_per_token": max(p["bytes_sent_per_token"] or 0.0 for p in r["peers"])}
            for r in rows}
    unlimited = {variant_of(r): r["tokens_per_second"] for r in throughput["runs"]
                 if r["bandwidth"] == "unlimited" and variant_of(r) in swarms}
    compressed = next((s for n, s in specs.items() if n != "dense"), specs["dense"])
    return {"record": RECORD, "model": shape(compressed), "codecs": list(specs),
            "variants": {n: {"codec": s.codec, "rank": s.rank, "compression": s.d_model / s.rank,
                             "constrained_stage_lr_scale": s.constrained_stage_lr_scale, "swarm": swarm_of(n)}
                         for n, s in specs.items()},
            "bottleneck_rank": specs["bottleneck"].rank if "bottleneck" in specs else None,
            "data": convergence["data"], "corpus_tokens": convergence["tokens"],
            "token_budget": {name: c["val"][-1][0] for name, c in curves.items()},
            "bandwidth": bandwidth, "latency": throughput["latency"], "shaping": "builtin",
            "training": {"device": convergence["device"], "machine": convergence["machine"],
                         "dtype": convergence["dtype"], "seconds": {n: c["seconds"] for n, c in curves.items()}},
            "throughput": {"device": throughput["device"], "machine": throughput["machine"],
                           "stages": throughput["stages"], "steps": rows[0]["steps"] if rows else None,
                           "unlimited_tokens_per_second": unlimited, "link": link},
            "target_dense_final": {"loss": dense_final, "codecs": record_figures(curves, tps, dense_final)},
            "target_common": {"loss": ttl["target_loss"], "codecs": record_figures(curves, tps, ttl["target_loss"])},
            "hours": {name: [[t / 3600, loss] for t, loss in c["val"]] for name, c in ttl["curves"].items()},
            "notes": ttl["notes"]}


def _reusable_curves(path: Path, specs: dict[str, RunSpec]) -> dict:
    """The curves of an earlier convergence.json trained with exactly the wanted spec, by name."""
    if not path.is_file():
        return {}
    old = json.loads(path.read_text())
    return {name: c for name, c in old["curves"].items()
            if name in specs and RunSpec.from_dict(c["spec"]) == specs[name]}


def _reusable_runs(path: Path, preset_name: str, latency: str, bandwidth: str, ceiling: bool,
                   swarms: dict[str, RunSpec]) -> tuple[dict | None, list[dict]]:
    """An earlier throughput.json of the same preset and latency, and its runs of the wanted swarms
    that have every row this bench needs (the shaped link, and the unshaped run with `ceiling`)."""
    if not path.is_file():
        return None, []
    old = json.loads(path.read_text())
    if old["preset"] != preset_name or old["latency"] != latency:
        return None, []
    links = {(bandwidth, "builtin")} | ({("unlimited", "none")} if ceiling else set())
    have = {name: [r for r in old["runs"] if variant_of(r) == name and (r["bandwidth"], r["shaping"]) in links]
            for name in swarms}
    return old, [r for rows in have.values() if len(rows) == len(links) for r in rows]


def run_record_bench(out_dir: str, tokens: int = 12_000_000, data: str | None = "stdlib", device: str = "cpu",
                     devices: str | None = None, bandwidth: str = "200mbit", latency: str = "50ms",
                     steps: int = 8, codec_tokens: float = 1.0, eval_points: int = 20, resume: bool = False,
                     parts: tuple[str, ...] = PARTS, smoke: bool = False,
                     variants: tuple[str, ...] | None = None) -> dict | None:
    """Run the asked `parts` for the `variants`; with `resume`, only what the output folder lacks (a
    curve trained with the same spec, a swarm's rows on the same link) is run, and merged into it.
    Combine the parts when every variant has both."""
    if smoke:
        tokens, steps, eval_points = min(tokens, 16 * 1024), min(steps, 3), 4
    specs = record_specs(tokens, smoke, codec_tokens, variants)
    dense = specs["dense"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    conv_path, tp_path = out / "convergence.json", out / "throughput.json"
    curves = _reusable_curves(conv_path, specs) if resume else {}
    if curves:
        print(f"reusing the training curves of {conv_path}: {', '.join(curves)}")
    todo = {n: s for n, s in specs.items() if n not in curves}
    if todo and "curves" in parts:
        every = max(1, dense.total_steps // eval_points)
        train_curves(out, dense.name, todo, data, device, every, 2 if smoke else 16, done=curves)
        curves = _reusable_curves(conv_path, specs)
    swarms = swarm_specs(specs)
    old, runs = _reusable_runs(tp_path, dense.name, latency, bandwidth, not smoke, swarms) if resume else (None, [])
    if runs:
        print(f"reusing the throughput rows of {tp_path}: {', '.join(dict.fromkeys(map(variant_of, runs)))}")
    missing = {n: s for n, s in swarms.items() if n not in {variant_of(r) for r in runs}}
    throughput = old if not missing else None
    if missing and "throughput" in parts:
        new = run_throughput_bench(str(out), preset_name=dense.name, steps=steps, bandwidth=bandwidth,
                                   latency=latency, device=device, devices=devices, dtype=dense.dtype,
                                   stages=dense.n_stages, ceiling=not smoke, variants=missing)
        throughput = merge_throughput(new, runs, out) if runs else new
    if len(curves) < len(specs) or throughput is None:
        lacking = [n for n in specs if n not in curves] + [f"the {n} swarm" for n in missing if throughput is None]
        print(f"record: no results yet for {', '.join(lacking)}; run again with --resume and that part in "
              "--parts to finish.")
        return None
    result = combine({**json.loads(conv_path.read_text()), "curves": curves}, throughput, bandwidth, specs)
    (out / "record.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "record.png")
    _print(result)
    return result


def _print(result: dict) -> None:
    for key, what in (("target_dense_final", "dense's final loss"), ("target_common", "the highest final loss")):
        t = result[key]
        print(f"time to {what} {t['loss']:.4f} at {result['bandwidth']}, {result['latency']}:")
        for name, r in t["codecs"].items():
            when = f"{r['seconds_to_target'] / 3600:.3f} h" if r["seconds_to_target"] is not None else "not reached"
            sooner = f"{r['x_sooner']:.2f}x sooner" if r["x_sooner"] is not None else \
                f"at most {r['x_sooner_at_most']:.2f}x sooner"
            steps = f"{r['steps_ratio']:.2f}x the steps" if r["steps_ratio"] is not None else "steps n/a"
            print(f"{name:>12}: {r['tokens_per_second']:9.0f} tok/s ({r['speed_ratio']:.2f}x dense), {steps}, "
                  f"{when}: {sooner}")


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    target = result["target_dense_final"]
    for name, pts in result["hours"].items():
        hours, loss = zip(*pts)
        r = target["codecs"][name]
        sooner = f", {r['x_sooner']:.2f}x sooner" if r["x_sooner"] is not None and name != "dense" else ""
        line, = ax.plot(hours, loss, marker=".", label=f"{name} ({r['tokens_per_second']:.0f} tok/s{sooner})")
        if r["seconds_to_target"] is not None:
            ax.plot([r["seconds_to_target"] / 3600], [target["loss"]], marker="o", color=line.get_color())
    ax.axhline(target["loss"], color="gray", linestyle=":", linewidth=1, label="dense's final held-out loss")
    ax.set_xscale("log")
    m = result["model"]
    ax.set_xlabel(f"wall-clock hours at {result['bandwidth']}, {result['latency']} per link (built-in shaper)")
    ax.set_ylabel("held-out loss (nats/byte)")
    ranks = sorted({v["rank"] for n, v in result.get("variants", {}).items() if v["codec"] != "dense"} or {m["rank"]})
    ax.set_title(f"record setting: {m['parameters'] / 1e6:.0f}M, d={m['d_model']}, {m['stages']} stages, "
                 f"k={', '.join(map(str, ranks))}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

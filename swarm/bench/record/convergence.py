"""`swarm bench convergence`: does re-fitting U pay off, and how long does each codec take to a loss?

Runs the in-process pipeline (which the multi-process swarm equals step by step, basis
switches included: tests/e2e/test_basis_updates.py) for each variant side by side on the
same data and seeds: a fixed random U, U re-fitted every `interval` steps for each interval
asked for, the dense codec as the uncompressed reference and the bottleneck codec. Held-out
loss is measured every `eval_every` steps. Writes convergence.json and convergence.png.

Then, given the throughput bench's results for the same preset (`--throughput-json`, or a
throughput.json already in the output folder), held-out loss against wall-clock time on the
limited link (`time_to_loss.py`): time_to_loss.json and time_to_loss.png.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from protocol.spec import RunSpec, preset
from swarm.bench.common.machine import machine_info

from .time_to_loss import time_to_loss, write_time_to_loss


@torch.no_grad()
def held_out_loss(pipe: InProcessPipeline, batches: list[torch.Tensor]) -> float:
    """Mean loss on fixed validation windows, through the same boundaries (codec and wire dtype)."""
    total = 0.0
    for tokens in batches:
        tokens = tokens.to(pipe.runners[0].device)
        z = None
        for r in pipe.runners:
            z = r.module(tokens[:, :-1], z)
            if not r.is_last:
                z = pipe.packer.roundtrip(z)
        total += float(torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), tokens[:, 1:].reshape(-1)))
    return total / len(batches)


def _variants(base: RunSpec, intervals: tuple[int, ...]) -> dict[str, RunSpec]:
    out = {"fixed U": base.replace(basis_updates=False)}
    for i in intervals:
        out[f"U re-fit every {i}"] = base.replace(basis_updates=True, basis_interval=i,
                                                   basis_switch_delay=max(1, min(10, i // 2)))
    out["dense"] = base.with_codec("dense", basis_updates=False)
    out["bottleneck"] = base.with_codec("bottleneck", basis_updates=False)
    return out


def _train_variant(name: str, spec_json: str, data: str | None, device: str, eval_every: int,
                   eval_batches: int, threads: int, schedule: str = "sync") -> dict:
    """One variant from scratch (a separate process when run in parallel); `schedule`: the in-process
    pipeline's (peer/runner/pipeline.py `SCHEDULES`: "sync", or "stale1", one-step-stale weights)."""
    spec = RunSpec.from_json(spec_json)
    torch.set_num_threads(threads)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # every variant alike; fp32 matmuls would dominate
        torch.backends.cudnn.allow_tf32 = True
    corpus = load_corpus(data, seq_len=spec.seq_len)
    src = BatchSource(corpus, spec.seq_len, spec.microbatch_size, spec.data_seed)
    val = src.val_batches(eval_batches)
    pipe = InProcessPipeline(spec, device=device, serialize=False, schedule=schedule)
    rec = {"spec": spec.to_dict(), "train": [], "val": [], "switches": [], "data": corpus.name,
           "tokens": len(corpus.tokens)}
    if schedule != "sync":  # a sync curve's record stays as it was
        rec["schedule"] = schedule
    t0, ema, steps = time.perf_counter(), None, spec.total_steps
    for step in range(steps):
        loss = pipe.train_step(step, src.microbatch).loss
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        rec["train"].append([(step + 1) * spec.batch_size * spec.seq_len, loss])
        last = pipe.runners[-1]
        if last.basis is not None and last.basis_version > 0 and last.basis_updated_step == step + 1:
            rec["switches"].append({"step": step + 1, "version": last.basis_version,
                                    "truncated": [r.last_truncation for r in pipe.runners]})
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            v = held_out_loss(pipe, val)
            rec["val"].append([(step + 1) * spec.batch_size * spec.seq_len, v])
            print(f"{name:>22} step {step + 1:5d}: train {ema:.4f} val {v:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    rec["seconds"] = time.perf_counter() - t0
    rec["final_val"] = rec["val"][-1][1]
    return rec


def run_convergence_bench(out_dir: str, preset_name: str = "small", steps: int = 2000,
                          intervals: tuple[int, ...] = (500, 100), data: str | None = "stdlib",
                          device: str = "cpu", eval_every: int = 100, eval_batches: int = 16,
                          smoke: bool = False, parallel: bool | None = None, throughput_json: str | None = None,
                          link: str | None = None, curves_json: str | None = None, dtype: str | None = None,
                          stage_lr: float | None = None) -> dict:
    """Train every variant (in parallel processes on a GPU) and compare their held-out loss; then
    their time to loss on `link` (default: the throughput results' first limited link), if the
    throughput results are there. `curves_json`: reuse a convergence.json's curves, no training.
    `stage_lr`: the subspace curves' `constrained_stage_lr_scale` (default: the preset's)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if curves_json:
        result = json.loads(Path(curves_json).read_text())
    else:
        result = _train_all(out, preset_name, steps, intervals, data, device, eval_every, eval_batches, smoke,
                            parallel, dtype, stage_lr)
    tp_path = Path(throughput_json) if throughput_json else out / "throughput.json"
    if tp_path.is_file():
        ttl = time_to_loss(result, json.loads(tp_path.read_text()), link)
        ttl["throughput_json"] = str(tp_path)
        write_time_to_loss(ttl, out, result["preset"])
        result["time_to_loss"] = ttl
    else:
        print(f"time to loss: no throughput results at {tp_path}; run `swarm bench throughput --out {out}` "
              f"(same preset) first, or pass --throughput-json.")
    return result


def _train_all(out: Path, preset_name: str, steps: int, intervals: tuple[int, ...], data: str | None, device: str,
               eval_every: int, eval_batches: int, smoke: bool, parallel: bool | None, dtype: str | None,
               stage_lr: float | None = None) -> dict:
    if smoke:  # two re-fits (steps 6 and 12, each 3 steps later) within 20 steps
        preset_name, steps, intervals, eval_every, eval_batches = "tiny", 20, (6,), 10, 2
    base = preset(preset_name, codec="subspace", total_steps=steps, dtype=dtype, constrained_stage_lr_scale=stage_lr)
    return train_curves(out, preset_name, _variants(base, intervals), data, device, eval_every, eval_batches,
                        parallel)


def train_curves(out: Path, preset_name: str, variants: dict[str, RunSpec], data: str | None, device: str,
                 eval_every: int, eval_batches: int, parallel: bool | None = None, done: dict | None = None,
                 schedules: dict[str, str] | None = None) -> dict:
    """Train `variants` side by side (same data and seeds; in parallel processes on a GPU unless
    `parallel` says otherwise); write OUT/convergence.json, with the curves of `done` (trained
    earlier, by name) first, and its plot. Each summary row's vs_dense is final / dense's final - 1,
    and vs_fixed the same against the "fixed U" variant, if any. `schedules`: a variant's in-process
    schedule, by name (default "sync"; `_train_variant`)."""
    parallel = device.startswith("cuda") if parallel is None else parallel
    threads = max(1, (os.cpu_count() or 1) // (len(variants) if parallel else 1))
    args = [(name, spec.to_json(), data, device, eval_every, eval_batches, threads,
             (schedules or {}).get(name, "sync")) for name, spec in variants.items()]
    if parallel:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(len(args), mp_context=ctx) as pool:
            recs = list(pool.map(_train_variant, *zip(*args)))
    else:
        recs = [_train_variant(*a) for a in args]
    curves = {**(done or {}), **dict(zip(variants, recs))}
    fixed, dense = curves.get("fixed U", curves["dense"])["final_val"], curves["dense"]["final_val"]
    summary = {name: {"final_val": c["final_val"], "vs_fixed": c["final_val"] / fixed - 1,
                      "vs_dense": c["final_val"] / dense - 1, "seconds": c["seconds"]} for name, c in curves.items()}
    if "fixed U" not in curves:
        for s in summary.values():
            del s["vs_fixed"]
    first = next(iter(variants.values()))
    result = {"preset": preset_name, "steps": first.total_steps, "data": recs[0]["data"], "tokens": recs[0]["tokens"],
              "device": device, "devices": [device], "machine": machine_info([device]), "dtype": first.dtype,
              "summary": summary, "curves": curves}
    if done:  # trained by an earlier call, perhaps on another machine: "machine" is this call's
        result["reused_curves"] = list(done)
    (out / "convergence.json").write_text(json.dumps(result) + "\n")
    _plot(result, out / "convergence.png")
    for name, s in summary.items():
        vs_fixed = f"{100 * s['vs_fixed']:+.2f}% vs fixed U, " if "vs_fixed" in s else ""
        print(f"{name:>22}: final val {s['final_val']:.4f} ({vs_fixed}{100 * s['vs_dense']:+.2f}% vs dense)")
    return result


def plot_loss_panels(a, b, curves: dict, bins: int = 200, label=lambda name, c: name) -> None:
    """One line per curve: held-out loss on axes `a`, training loss averaged into about `bins` points on `b`."""
    for name, c in curves.items():
        xs, ys = zip(*c["val"])
        a.plot(xs, ys, label=label(name, c), marker=".")
        tx, ty = zip(*c["train"])
        k = max(1, len(ty) // bins)
        smooth = [sum(ty[i:i + k]) / len(ty[i:i + k]) for i in range(0, len(ty), k)]
        b.plot(tx[::k][:len(smooth)], smooth, label=name)


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    plot_loss_panels(a, b, result["curves"])
    a.set_title(f"held-out loss, {result['preset']} on {result['data']}")
    b.set_title("training loss (binned)")
    for ax in (a, b):
        ax.set_xlabel("tokens")
        ax.set_ylabel("loss (nats/byte)")
        ax.legend()
    lo = min(v for c in result["curves"].values() for _, v in c["val"])
    hi = max(c["val"][min(1, len(c["val"]) - 1)][1] for c in result["curves"].values())
    if math.isfinite(lo) and math.isfinite(hi) and hi > lo:
        a.set_ylim(lo - 0.05 * (hi - lo), hi)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

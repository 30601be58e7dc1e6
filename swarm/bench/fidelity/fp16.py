"""`python -m swarm.bench.fidelity.fp16`: does fp16 compute with dynamic loss scaling train like bf16?

Trains the in-process pipeline (which a swarm equals step by step) twice from the same seeds on
the same data: `--dtype bf16` and `--dtype fp16` (protocol/loss_scale.py), held-out loss every
`eval_every` steps, and records each fp16 step the pipeline skipped for an overflow and the
loss scale after every step. Issue 23's target: fp16's final held-out loss within 1% of
bf16's on `small` after 500 steps. Writes fp16.json and fp16.png.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from protocol.spec import preset
from swarm.bench.common.machine import machine_info
from swarm.bench.record.convergence import held_out_loss, plot_loss_panels


def train(spec_name: str, dtype: str, steps: int, data: str | None, device: str, eval_every: int,
          eval_batches: int) -> dict:
    spec = preset(spec_name, dtype=dtype, total_steps=steps)
    corpus = load_corpus(data, seq_len=spec.seq_len)
    src = BatchSource(corpus, spec.seq_len, spec.microbatch_size, spec.data_seed)
    val = src.val_batches(eval_batches)
    pipe = InProcessPipeline(spec, device=device, serialize=False)
    rec = {"spec": spec.to_dict(), "train": [], "val": [], "skipped": [], "scale": [], "data": corpus.name}
    t0 = time.perf_counter()
    for step in range(steps):
        result = pipe.train_step(step, src.microbatch)
        rec["train"].append([step + 1, result.loss])
        rec["scale"].append(pipe.runners[0].scale)
        if result.skipped:
            rec["skipped"].append(step + 1)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            v = held_out_loss(pipe, val)
            rec["val"].append([step + 1, v])
            print(f"{dtype} step {step + 1:4d}: train {result.loss:.4f} val {v:.4f} scale {rec['scale'][-1]:g} "
                  f"skipped {len(rec['skipped'])} ({time.perf_counter() - t0:.0f} s)", flush=True)
    rec["seconds"] = time.perf_counter() - t0
    rec["final_val"] = rec["val"][-1][1]
    return rec


def run_fp16_bench(out_dir: str, preset_name: str = "small", steps: int = 500, data: str | None = "stdlib",
                   device: str = "cuda", eval_every: int = 50, eval_batches: int = 16) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    curves = {dt: train(preset_name, dt, steps, data, device, eval_every, eval_batches) for dt in ("bf16", "fp16")}
    rel = curves["fp16"]["final_val"] / curves["bf16"]["final_val"] - 1
    result = {"preset": preset_name, "steps": steps, "data": curves["bf16"]["data"], "device": device,
              "machine": machine_info([device]), "torch": torch.__version__,
              "summary": {"bf16_final_val": curves["bf16"]["final_val"], "fp16_final_val": curves["fp16"]["final_val"],
                          "fp16_vs_bf16": rel, "within_1_percent": abs(rel) <= 0.01,
                          "fp16_skipped_steps": curves["fp16"]["skipped"],
                          "fp16_final_scale": curves["fp16"]["scale"][-1]},
              "curves": curves}
    (out / "fp16.json").write_text(json.dumps(result) + "\n")
    _plot(result, out / "fp16.png")
    print(f"final held-out loss: bf16 {result['summary']['bf16_final_val']:.4f}, fp16 "
          f"{result['summary']['fp16_final_val']:.4f} ({100 * rel:+.2f}%), fp16 skipped "
          f"{len(curves['fp16']['skipped'])} step(s), final scale {curves['fp16']['scale'][-1]:g}")
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    plot_loss_panels(a, b, result["curves"], bins=100, label=lambda name, c: f"{name} (final {c['final_val']:.4f})")
    gpu = next(iter(result["machine"]["gpus"].values()), result["device"])
    a.set_title(f"held-out loss, {result['preset']} ({gpu})")
    b.set_title("training loss (binned)")
    for ax in (a, b):
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/byte)")
        ax.legend()
    s = b.twinx()
    s.step(range(1, len(result["curves"]["fp16"]["scale"]) + 1), result["curves"]["fp16"]["scale"], "k:", lw=0.8)
    s.set_yscale("log", base=2)
    s.set_ylabel("fp16 loss scale (dotted)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench-out/fp16", help="output folder (default: bench-out/fp16)")
    p.add_argument("--preset", default="small", help="preset (default: small)")
    p.add_argument("--steps", type=int, default=500, help="steps per dtype (default: 500)")
    p.add_argument("--data", default="stdlib", help="corpus (default: stdlib)")
    p.add_argument("--device", default="cuda", help="device (default: cuda)")
    p.add_argument("--eval-every", type=int, default=50, help="steps between held-out evaluations (default: 50)")
    a = p.parse_args(argv)
    run_fp16_bench(a.out, a.preset, a.steps, a.data, a.device, a.eval_every)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

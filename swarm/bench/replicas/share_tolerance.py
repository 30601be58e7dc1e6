"""`swarm bench share-tolerance`: how far apart honest computations of one replica's share fall,
on the same kernels, on other kernels and on another dtype, against what lies score (issue 21
item 2; `TOLERANCE` in peer/checks/share_check.py is set from it, docs/security.md).

A pipeline of the preset (peer/runner/pipeline.py: every stage on --device, real wire bytes) trains
--warm-steps steps; for --steps more it keeps every stage's state before the step and the
boundary messages each microbatch brought it (the activation, and the gradient from downstream).
A step's microbatches are dealt round-robin to --replicas shares, and every share of every stage
after the head (the stages spot checks cover) is computed as

- sent: a replica's own path on --device (forward, backward into .grad, `share()` as the reduce sends it);
- recomputed: `share_from_inputs`, what a checker runs, on --device, and again (`again`);
- other kernels: the same on --device with the math attention kernel and cuBLAS's reduced-precision
  bf16 reduction flipped (a stand-in for another GPU model's kernels);
- cpu, cpu-fp32: the same on the CPU from the same state and bytes, in the run's dtype and in fp32.

Each is scored against the recomputed share as a check scores it:
disagreement(a, b) = ||a - b|| / ||a|| (peer/checks/share_check.py), a the recomputed share; so are three
lies: -50 x sent, another share's sent (the right shape, other microbatches), and random numbers
of sent's norm. Writes share_tolerance.json and share_tolerance.png into --out.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import statistics
from collections.abc import Iterator
from pathlib import Path

import torch

from peer.checks.share_check import TOLERANCE, disagreement, share_from_inputs
from peer.replica.memory_swarm import batches
from peer.runner.pipeline import InProcessPipeline
from peer.runner.stage import StageRunner
from protocol.codecs import WirePacker
from protocol.spec import COMPUTE_DTYPES, preset
from protocol.wire import WireLimits, decode_message
from swarm.bench.common.machine import machine_info

HONEST = ("again", "sent", "other kernels", "cpu", "cpu-fp32")
LIES = ("x -50", "another share", "random")
Bodies = list[tuple[bytes, bytes | None]]


@contextlib.contextmanager
def other_kernels() -> Iterator[None]:
    """Attention by the math kernel, and cuBLAS's bf16 reductions the other way round."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = not before
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


def on_cpu(runner: StageRunner, dtype: str) -> StageRunner:
    """A CPU runner of `runner`'s stage holding its state, computing in `dtype`."""
    spec = dataclasses.replace(runner.spec, dtype=dtype)
    basis = runner.basis.to("cpu", torch.float32) if runner.basis is not None else None
    cpu = StageRunner(spec, runner.stage, "cpu", basis)
    cpu.module.load_state_dict({k: v.cpu() for k, v in runner.module.state_dict().items()})
    return cpu


def replica_share(before: StageRunner, limits: WireLimits, bodies: Bodies, mbs: list[int]) -> torch.Tensor:
    """What a replica that served `mbs` sends in the reduce: its runner's accumulated gradients."""
    r, packer = copy.deepcopy(before), WirePacker.for_spec(before.spec)
    for mb, (act, grad) in zip(mbs, bodies):
        am = decode_message(act, limits)
        z = packer.unpack(am.payload, r.dtype, r.device)
        if r.is_last:
            r.forward_backward(r.step, mb, am.tokens, z)
            continue
        r.forward(r.step, mb, am.tokens, z)
        gm = decode_message(grad, limits)
        r.backward(r.step, mb, packer.unpack(gm.payload, r.dtype, r.device), gm.overflow)
    return r.share(False)[1]


def score_shares(before: StageRunner, bodies: Bodies, shares: list[list[int]], seed: int) -> list[dict]:
    """Every pair and lie of HONEST and LIES for each share of one stage's step (`bodies` per microbatch)."""
    limits = WireLimits.for_spec(before.spec, before.basis_version, accept_next_basis=True)
    packer = WirePacker.for_spec(before.spec)
    cpus = {"cpu": on_cpu(before, before.spec.dtype), "cpu-fp32": on_cpu(before, "fp32")}
    gen = torch.Generator().manual_seed(seed)
    sent = [replica_share(before, limits, [bodies[m] for m in mbs], mbs) for mbs in shares]
    rows = []
    for i, mbs in enumerate(shares):
        inputs = [bodies[m] for m in mbs]
        rec = share_from_inputs(before, packer, limits, inputs)
        runs = {"again": share_from_inputs(before, packer, limits, inputs), "sent": sent[i]}
        with other_kernels():
            runs["other kernels"] = share_from_inputs(before, packer, limits, inputs)
        runs.update({k: share_from_inputs(r, packer, limits, inputs) for k, r in cpus.items()})
        noise = torch.randn(sent[i].shape, generator=gen, dtype=torch.float64)
        lies = {"x -50": -50 * sent[i], "another share": sent[(i + 1) % len(shares)],
                "random": noise * (sent[i].double().norm() / noise.norm())}
        rows.append({"stage": before.stage, "step": before.step, "microbatches": mbs,
                     "norm": float(rec.double().norm()),
                     **{k: disagreement(rec, v) for k, v in runs.items()},
                     **{k: disagreement(rec, v) for k, v in lies.items() if len(shares) > 1 or k != "another share"}})
    return rows


def measure(preset_name: str, codec: str, device: str, dtype: str | None, warm_steps: int, steps: int,
            replicas: int, data: str | None, seed: int = 0) -> list[dict]:
    """The rows of `score_shares` for every stage after the head over `steps` steps after `warm_steps`."""
    torch.manual_seed(seed)
    spec = preset(preset_name, codec=codec, dtype=dtype)
    pipe, src = InProcessPipeline(spec, device), batches(spec, data)
    for step in range(warm_steps):
        pipe.train_step(step, src)
    rows: list[dict] = []
    for step in range(warm_steps, warm_steps + steps):
        before = {s: copy.deepcopy(r) for s, r in enumerate(pipe.runners) if s > 0}
        inputs = train_keeping_inputs(pipe, step, src)
        n = spec.n_microbatches
        shares = [list(range(r, n, replicas)) for r in range(min(replicas, n))]
        for s, runner in before.items():
            rows += score_shares(runner, inputs[s], shares, seed + 1000 * step + s)
        del before
    return rows


def train_keeping_inputs(pipe: InProcessPipeline, step: int, src) -> dict[int, Bodies]:
    """Train `step`; per stage after the head, the (activation, gradient or None) bytes of each microbatch."""
    got: dict[int, dict[int, list[bytes]]] = {s: {} for s in range(1, pipe.spec.n_stages)}

    def tap(to: int, mb: int, body: bytes) -> None:
        if to > 0:
            got[to].setdefault(mb, []).append(body)  # the activation first, the gradient after it
    pipe.tap = tap
    try:
        pipe.train_step(step, src)
    finally:
        pipe.tap = None
    return {s: [(b[0], b[1] if len(b) > 1 else None) for b in (by[m] for m in range(pipe.spec.n_microbatches))]
            for s, by in got.items()}


def summarize(rows: list[dict]) -> dict:
    """Per pair and lie: max and median (min too for lies) over the rows."""
    out = {}
    for k in HONEST + LIES:
        v = [r[k] for r in rows if k in r]
        if v:
            out[k] = {"max": max(v), "median": statistics.median(v), "min": min(v), "n": len(v)}
    return out


def run_share_tolerance_bench(out_dir: str, presets: tuple[str, ...] = ("tiny", "small"),
                              codecs: tuple[str, ...] = ("subspace", "dense"), device: str = "cpu",
                              dtype: str | None = None, warm_steps: int = 20, steps: int = 2, replicas: int = 3,
                              data: str | None = None, smoke: bool = False) -> dict:
    if smoke:
        presets, codecs, warm_steps, steps = ("tiny",), ("subspace",), 1, 1
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for name in presets:
        for codec in codecs:
            rows = measure(name, codec, device, dtype, warm_steps, steps, replicas, data)
            summary = summarize(rows)
            runs.append({"preset": name, "codec": codec, "dtype": preset(name, codec=codec, dtype=dtype).dtype,
                         "summary": summary, "rows": rows})
            print(f"{name} {codec}: " + ", ".join(f"{k} max {v['max']:.3g}" for k, v in summary.items()
                                                  if k in HONEST) + "; smallest lie " +
                  f"{min(v['min'] for k, v in summary.items() if k in LIES):.3g}", flush=True)
    honest = {k: max(r["summary"][k]["max"] for r in runs) for k in HONEST}
    smallest_lie = min(r["summary"][k]["min"] for r in runs for k in LIES if k in r["summary"])
    result = {"device": device, "devices": [device], "machine": machine_info([device]), "warm_steps": warm_steps,
              "steps": steps, "replicas": replicas, "data": data, "honest_max": honest, "smallest_lie": smallest_lie,
              "tolerance": TOLERANCE[COMPUTE_DTYPES[runs[0]["dtype"]]], "runs": runs}
    (out / "share_tolerance.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "share_tolerance.png")
    print("worst honest pair: " + ", ".join(f"{k} {v:.3g}" for k, v in honest.items()) +
          f"; smallest lie {smallest_lie:.3g}", flush=True)
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, ax = plt.subplots(figsize=(11, 3.8))
    width = 0.8 / len(HONEST + LIES)
    for j, k in enumerate(HONEST + LIES):
        xs = [i + (j - len(HONEST + LIES) / 2) * width for i in range(len(runs))]
        ys = [max(r["summary"][k]["max"] if k in HONEST else r["summary"][k]["min"], 1e-12) if k in r["summary"]
              else float("nan") for r in runs]
        ax.bar(xs, ys, width, label=f"{k} ({'max' if k in HONEST else 'min'})", hatch="//" if k in LIES else None)
    ax.axhline(result["tolerance"], color="k", ls="--", lw=1, label=f"tolerance {result['tolerance']:g}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(runs)), [f"{r['preset']} {r['codec']} ({r['dtype']})" for r in runs])
    ax.set_ylabel("||a - b|| / ||a||  (a: recomputed)")
    where = result.get("machine", {}).get("description", result["device"])
    ax.set_title(f"honest computations of a share vs lies ({where}; 1e-12 stands for 0)", fontsize=9)
    ax.set_ylim(1e-13, 1e3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""`swarm bench share-tolerance --liar-steps N`: how far a replica that lies on every step just under the spot
checks' tolerance moves its stage's weights and the loss (issue 57 item 4; docs/security.md).

A check recomputes a share h and accepts what was sent if ||sent - h|| <= tol x ||h|| (peer/checks/share_check.py).
So a liar that sends

    lie = h + eps ||h|| d,   ||d|| = 1,   eps = 0.99 x tol

is never caught, whatever unit direction d it picks (in the SyncLayout coordinates the check compares). Shapes:

- scale: d = h / ||h||, lie = (1 + eps) h. Adam divides by the gradient's scale, so this nearly cancels;
- fixed: d a fixed random unit vector per stage: a consistent bias that Adam does not cancel;
- grow: d = -pack(sign W) / ||.||: the descent step then pushes every weight away from zero (anti weight decay);
- drag: d = -pack(m) / ||.||, m the optimizer's first moment, which every replica holds: a steady pull against
  the update the stage is taking (where the gradient is mostly noise, eps of the share is a larger fraction of
  its mean; the adversary's pick for slowing training down). Before the first step: d = -h / ||h||.

Every variant trains the preset as a pipeline of stages (peer/runner/pipeline.py, one process) whose stages each
sum R replicas' shares as the reduce does (peer/runner/reduced.py `sum_contributions`): replica r computes
microbatches r, r + R, ...; the stage applies sum_r share_r. One replica of every liar stage sends the lie
instead of its share. Beside them: honest runs that differ only in the data order or the weights' seed (the noise
floor). Every --eval-every steps: held-out loss on fixed windows, and each run's weights, from which
||W_v - W_honest|| / ||W_honest|| per stage. Writes under_tolerance.json and under_tolerance.png into --out.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from peer.checks.share_check import TOLERANCE, disagreement
from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import BatchFn, InProcessPipeline, StepResult
from peer.runner.stage import StageRunner
from protocol.spec import RunSpec, preset
from swarm.bench.common.machine import machine_info
from swarm.bench.record.convergence import held_out_loss

SHAPES = ("scale", "fixed", "grow", "drag")
TOLERANCES = {"fp32": TOLERANCE[torch.float32], "bf16": TOLERANCE[torch.bfloat16]}
NOISE = ("data", "model")  # what an honest noise-floor run changes: the data order's seed, or the weights'
MARGIN = 0.99  # a lie's relative error, as a fraction of the tolerance


@dataclass(frozen=True)
class Variant:
    """One run: honest (`shape` "none"), a liar (`shape` in SHAPES, relative error `rel`), or a noise-floor run."""

    name: str
    shape: str = "none"
    rel: float = 0.0  # eps: ||lie - h|| / ||h||
    tolerance: str = ""  # which dtype's tolerance eps is under
    seed_offset: int = 0  # added to the spec's seed (weights) and data_seed (data order)
    data_offset: int = 0


@dataclass
class Point:
    """One evaluation of one run after `step` steps."""

    step: int
    held_out: float
    train: float | None  # mean training loss of the steps since the last evaluation (None at step 0)
    distance: list[float] | None = None  # per stage: ||W_v - W_honest|| / ||W_honest||
    norm_ratio: list[float] | None = None  # per stage: ||W_v|| / ||W_honest||


def lie_direction(shape: str, runner: StageRunner, h: torch.Tensor, fixed: torch.Tensor) -> torch.Tensor:
    """The unit vector d (SyncLayout coordinates, h's) of a lie h + eps ||h|| d (module docstring)."""
    if shape == "scale":
        d = h
    elif shape == "fixed":
        d = fixed
    elif shape == "grow":
        d = -runner.layout.pack([p.detach().sign() for p in runner.params], runner.current_U())
    elif shape == "drag":
        m = [runner.optimizer.state.get(p, {}).get("exp_avg") for p in runner.params]
        d = -h if any(x is None for x in m) else -runner.layout.pack(m, runner.current_U())
    else:
        raise ValueError(f"unknown lie shape {shape!r}; choose one of {', '.join(SHAPES)}.")
    return _unit(d)


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm().clamp_min(1e-30)


class ReplicatedPipeline(InProcessPipeline):
    """The in-process pipeline whose every stage sums `replicas` shares, one of them a liar's in `liar_stages`."""

    def __init__(self, spec: RunSpec, replicas: int, variant: Variant, liar_stages: tuple[int, ...]) -> None:
        super().__init__(spec, "cpu", serialize=False)  # the wire dtype's rounding kept, the bytes skipped
        if not 1 <= replicas <= spec.n_microbatches:
            raise ValueError(f"{replicas} replicas for {spec.n_microbatches} microbatches a step: each needs one.")
        self.replicas, self.variant = replicas, variant
        self.liars = liar_stages if variant.shape != "none" else ()
        gen = torch.Generator().manual_seed(1000 + spec.seed)
        self.fixed = {s: _unit(torch.randn(self.runners[s].layout.numel, generator=gen)) for s in self.liars}
        self.scores: list[float] = []  # what a spot check of every lie would have scored: ||lie - h|| / ||h||

    def train_step(self, step: int, batch: BatchFn) -> StepResult:
        n, losses = self.spec.n_microbatches, []
        per_mb: list[list[torch.Tensor]] = [[] for _ in self.runners]  # stage -> flat gradient of each microbatch
        stats: list[torch.Tensor | None] = [None] * len(self.runners)  # the step's re-fit statistic, per stage
        for mb in range(n):
            losses.append(self._microbatch(step, mb, batch(step, mb)))
            for s, r in enumerate(self.runners):
                _, flat, stats[s] = r.contribution()  # this microbatch's gradient alone, as a replica packs it
                per_mb[s].append(flat)
                r.optimizer.zero_grad(set_to_none=True)  # the next microbatch's gradient alone
        for s, r in enumerate(self.runners):
            shares = [_sum(per_mb[s][i::self.replicas]) for i in range(self.replicas)]
            if s in self.liars:
                h = shares[0]
                lie = h + (self.variant.rel * float(h.norm())) * lie_direction(self.variant.shape, r, h, self.fixed[s])
                self.scores.append(disagreement(h, lie))
                shares[0] = lie
            r.load_flat_grads(_sum(shares), stats[s].clone() if stats[s] is not None else None)
            # the swarm applies a shared sum with portable operations (the same bits on every machine); one
            # process needs no agreement, and torch's fused ones take 0.6x the time here: the same arithmetic
            r.grads_shared = False
            r.optimizer_step()
        self._maybe_refit()
        return StepResult(step, sum(losses) / n, 0, losses)


def _sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    """In replica order, as `sum_contributions` adds in peer-id order."""
    total = tensors[0].clone()
    for t in tensors[1:]:
        total.add_(t)
    return total


def flat_weights(pipe: InProcessPipeline) -> list[torch.Tensor]:
    """Each stage's trainable parameters, flattened, in float32."""
    return [torch.cat([p.detach().reshape(-1).float() for p in r.params]) for r in pipe.runners]


def train_variant(spec: RunSpec, variant: Variant, steps: int, replicas: int, liar_stages: tuple[int, ...],
                  data: str | None, eval_every: int, eval_batches: int, cache: str, tag: str) -> dict:
    """Train one variant; its points (no distances yet) and the check scores of its lies. Writes its weights at
    every evaluation to `cache`/{tag}-{step}.pt for `add_distances` to compare, then the run to `cache`/{tag}.json
    (last: a run found there is whole)."""
    torch.set_num_threads(1)  # one thread: the same numbers every time, and workers side by side
    vspec = spec.replace(seed=spec.seed + variant.seed_offset, data_seed=spec.data_seed + variant.data_offset)
    corpus = load_corpus(data, seq_len=spec.seq_len)
    src = BatchSource(corpus, spec.seq_len, spec.microbatch_size, vspec.data_seed).microbatch
    val = BatchSource(corpus, spec.seq_len, spec.microbatch_size, spec.data_seed).val_batches(eval_batches)
    pipe = ReplicatedPipeline(vspec, replicas, variant, liar_stages)
    points, train, t0 = [], [], time.perf_counter()
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            with torch.no_grad():
                loss = held_out_loss(pipe, val)
            points.append(Point(step, loss, sum(train) / len(train) if train else None))
            torch.save(flat_weights(pipe), Path(cache) / f"{tag}-{step}.pt")
            train = []
        if step < steps:
            train.append(pipe.train_step(step, src).loss)
        if step and step % 250 == 0:
            print(f"  {variant.name}: step {step}/{steps}, held-out {points[-1].held_out:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    run = {"variant": asdict(variant), "tag": tag, "points": [asdict(p) for p in points],
           "seconds": time.perf_counter() - t0,
           "lie_scores": {"min": min(pipe.scores), "max": max(pipe.scores), "n": len(pipe.scores)}
           if pipe.scores else None}
    (Path(cache) / f"{tag}.json").write_text(json.dumps(run))
    return run


def run_key(*what: object) -> str:
    """What makes a run's numbers (spec, variant, steps, ...), hashed: its name in the cache."""
    return hashlib.sha256(json.dumps([asdict(w) if isinstance(w, Variant) else w for w in what],
                                     default=str).encode()).hexdigest()[:16]


def parse_liars(text: str) -> tuple[tuple[str, str], ...]:
    """"bf16,fp32:drag,1e-2:grow" -> every shape at bf16's tolerance, drag at fp32's, grow at 1e-2:
    comma-separated TOL[:SHAPE], TOL a dtype or a number."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        tol, _, shape = item.partition(":")
        if shape and shape not in SHAPES:
            raise ValueError(f"--liars: {item!r}: the shape is none of {', '.join(SHAPES)}.")
        tolerance_of(tol)
        out += [(tol, s) for s in ((shape,) if shape else SHAPES)]
    return tuple(out)


def tolerance_of(label: str) -> float:
    """A dtype's tolerance ("bf16": 2e-2) or a number in (0, 1) ("1e-2": a tighter tolerance, to try one)."""
    if label in TOLERANCES:
        return TOLERANCES[label]
    try:
        value = float(label)
    except ValueError:
        value = 0.0
    if not 0 < value < 1:
        raise ValueError(f"--liars: {label!r} is neither one of {', '.join(TOLERANCES)} nor a number in (0, 1).")
    return value


def parse_noise(text: str) -> tuple[tuple[str, int], ...]:
    """"data,model,data+2" -> the honest noise-floor runs: (what changes, NOISE; by how much its seed moves)."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        kind, _, n = item.partition("+")
        if kind not in NOISE or not (n or "1").isdigit() or int(n or "1") < 1:
            raise ValueError(f"--noise: {item!r} is not KIND[+N] with KIND in {', '.join(NOISE)} and N >= 1.")
        out.append((kind, int(n or "1")))
    return tuple(out)


def variants(liars: tuple[tuple[str, str], ...], noise: tuple[tuple[str, int], ...]) -> list[Variant]:
    """The honest reference first, then the noise-floor runs, then each (tolerance, shape) of `liars`."""
    out = [Variant("honest")]
    out += [Variant(f"honest, {k} seed +{n}", seed_offset=n * (k == "model"), data_offset=n * (k == "data"))
            for k, n in noise]
    out += [Variant(f"{t} tol: {s}", s, MARGIN * tolerance_of(t), t) for t, s in liars]
    return out


def add_distances(runs: list[dict], cache: str) -> None:
    """Per point of every run: ||W_v - W_h|| / ||W_h|| and ||W_v|| / ||W_h|| per stage, h the honest run."""
    for i, point in enumerate(runs[0]["points"]):  # every run is evaluated at the same steps
        ref = [w.double() for w in torch.load(Path(cache) / f"{runs[0]['tag']}-{point['step']}.pt")]
        for run in runs:
            p = run["points"][i]
            mine = [w.double() for w in torch.load(Path(cache) / f"{run['tag']}-{p['step']}.pt")]
            p["distance"] = [float((a - b).norm() / b.norm()) for a, b in zip(mine, ref)]
            p["norm_ratio"] = [float(a.norm() / b.norm()) for a, b in zip(mine, ref)]


def summarize(runs: list[dict], tail: int) -> dict:
    """Per run: final held-out loss and its mean over the last `tail` evaluations ("tail"), their differences from
    the honest run's, and the final weight distance and norm ratio per stage. The noise floor: the largest
    |difference| of an honest noise run (`exceeds_floor`: a liar's is larger, at the end or over the tail); and the
    honest runs' range, reference and noise runs together (`outside_honest_range`: a liar's tail mean is not in it)."""
    honest = runs[0]["points"]
    rows = {}
    for run in runs:
        pts = run["points"]
        deltas = [p["held_out"] - h["held_out"] for p, h in zip(pts, honest)]
        rows[run["variant"]["name"]] = {
            "held_out": pts[-1]["held_out"], "held_out_tail": sum(p["held_out"] for p in pts[-tail:]) / tail,
            "delta": deltas[-1], "delta_tail": sum(deltas[-tail:]) / tail, "distance": pts[-1]["distance"],
            "norm_ratio": pts[-1]["norm_ratio"], "lie_scores": run["lie_scores"]}
    fair = [rows[r["variant"]["name"]] for r in runs if r["variant"]["shape"] == "none"]
    floor = {k: max((abs(r[k]) for r in fair[1:]), default=float("nan")) for k in ("delta", "delta_tail")}
    spread = {k: {"min": min(r[k] for r in fair), "max": max(r[k] for r in fair),
                  "mean": sum(r[k] for r in fair) / len(fair)} for k in ("held_out", "held_out_tail")}
    for run in runs:
        if run["variant"]["shape"] != "none":
            row = rows[run["variant"]["name"]]
            row["exceeds_floor"] = abs(row["delta"]) > floor["delta"] or abs(row["delta_tail"]) > floor["delta_tail"]
            t = spread["held_out_tail"]
            row["outside_honest_range"] = not t["min"] <= row["held_out_tail"] <= t["max"]
    return {"runs": rows, "noise_floor": floor, "honest_range": spread}


def run_under_tolerance_bench(out_dir: str, preset_name: str = "tiny", codec: str = "subspace", steps: int = 2000,
                              replicas: int = 2, liar_stages: tuple[int, ...] | None = None,
                              liars: tuple[tuple[str, str], ...] | None = None,
                              noise: tuple[tuple[str, int], ...] = (("data", 1), ("model", 1)),
                              data: str | None = None, eval_every: int = 50, eval_batches: int = 16,
                              workers: int = 1, cache: str | None = None) -> dict:
    """Train `variants(liars, noise)` of the preset for `steps` steps (fp32, CPU; lr decayed over `steps`),
    `workers` processes side by side; liars in `liar_stages` (default: every stage after the head), `liars`
    (tolerance, shape) pairs (default: every shape at fp32's and bf16's). `cache`: a folder that keeps every run
    (its JSON and weights) as it ends; a run found there (the same spec, variant, steps...) is not trained again,
    so a killed bench resumes and a later one with other liars reuses the honest runs. None: a temporary one."""
    spec = preset(preset_name, codec=codec, dtype="fp32", total_steps=steps)
    liar_stages = tuple(range(1, spec.n_stages)) if liar_stages is None else liar_stages
    todo = variants(parse_liars("fp32,bf16") if liars is None else liars, noise)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() if cache is None else contextlib.nullcontext(cache) as where:
        Path(where).mkdir(parents=True, exist_ok=True)
        args = [(spec, v, steps, replicas, liar_stages, data, eval_every, eval_batches, where,
                 run_key(spec.to_json(), v, steps, replicas, liar_stages, data, eval_every, eval_batches))
                for v in todo]
        done = {a[-1]: json.loads((Path(where) / f"{a[-1]}.json").read_text()) for a in args
                if (Path(where) / f"{a[-1]}.json").exists()}
        print(f"{len(todo)} runs, {len(done)} of them in the cache {where}", flush=True)
        left = [a for a in args if a[-1] not in done]
        if workers > 1 and len(left) > 1:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                done.update((r["tag"], r) for r in pool.map(train_variant, *zip(*left)))
        else:
            done.update((a[-1], train_variant(*a)) for a in left)
        runs = [done[a[-1]] for a in args]
        add_distances(runs, where)
    tail = max(1, len(runs[0]["points"]) // 10)
    tolerances = {v.tolerance: tolerance_of(v.tolerance) for v in todo if v.tolerance}
    result = {"preset": preset_name, "codec": codec, "dtype": "fp32", "device": "cpu", "devices": ["cpu"],
              "machine": machine_info(["cpu"]), "steps": steps, "replicas": replicas, "liar_stages": list(liar_stages),
              "margin": MARGIN, "tolerances": tolerances, "data": data, "eval_every": eval_every,
              "eval_batches": eval_batches, "tail_evals": tail, "spec": spec.to_json(),
              "summary": summarize(runs, tail), "runs": runs}
    (out / "under_tolerance.json").write_text(json.dumps(result, indent=1) + "\n")
    from .under_tolerance_plot import plot
    plot(result, out / "under_tolerance.png")
    floor = result["summary"]["noise_floor"]
    print(f"noise floor (honest runs): |held-out delta| {floor['delta']:.4g} at the end, "
          f"{floor['delta_tail']:.4g} over the last {tail} evaluations", flush=True)
    for name, row in result["summary"]["runs"].items():
        print(f"{name:>24}: held-out {row['held_out']:.4f} ({row['delta']:+.4g}; tail {row['delta_tail']:+.4g}), "
              "weights " + ", ".join(f"{d:.3g}" for d in row["distance"]), flush=True)
    return result

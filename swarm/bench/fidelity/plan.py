"""What `swarm bench fidelity` trains: the jobs of each plan, grouped by the question they answer.

Groups (docs/fidelity.md reads them in this order):

- `scale`: dense against subspace at a fixed ratio (k = d/100 on a GPU, up to d=1024; d/16 on a
  CPU) across widths at equal tokens: does the gap shrink with width?
- `headline`: the `small` preset at the issue's 2000 steps, dense against subspace at 16x, with
  the defaults the issue measured and with the best settings the ablations found.
- `frontier`: held-out loss against compression (payload bytes per token): subspace with a fixed
  and a re-fitted U and the bottleneck, each at k = d/64, d/32, d/16, d/8, and subspace with an
  int8 wire at k = d/32 .. d/4 (twice the rank for about the same bytes); dense as the reference.
- `seeds`: dense and the subspace baseline with two more seeds: the spread of one configuration.
- `lr`, `optimizer`, `embed`, `layers`, `refit`: one cause at a time against the subspace
  baseline of the same plan (its lr, second-moment scaling, embedding split, number of
  constrained layers, re-fit statistic / interval / step).
- `hybrid`: issue 24's hybrid codec at the plan's numbers per token (3/4 exact subspace coordinates,
  1/4 a trained bottleneck of the rest; free stages), with and without the stage lr x0.03, beside
  the subspace codec with it and dense (docs/fidelity.md 3h).
- `gap`, `gap-seed1`, `gap-seed2` (not in the default plan: `--groups gap,gap-seed1`): why the
  constrained layers add nothing (docs/fidelity.md 3d), each with its own dense and subspace
  references of seed 0 / 1: one compressed boundary instead of two, the constraint with
  full-width boundaries, and lr multipliers of the constrained weights and stages; seed 2 for
  the one-boundary layout whose two seeds disagreed.

Plans: "gpu" (bf16, the `small` shape, one microbatch per step; sized for ~10 minutes of 4 H100s),
"cpu" (fp32, d=128, 4 layers, 3 of them constrained: the reduced size the CPU results in
docs/fidelity.md were measured at) and "smoke" (seconds, for CI). Within a group every job
trains the same number of tokens on the same data and seeds. `with_dense_repeats` (`--dense-runs N`)
runs every dense job N times, since dense on a GPU is not bit-repeatable.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from protocol.spec import HYBRID_STAGE_LR_SCALE, HYBRID_WARMUP_SCALE, RunSpec, preset

from .train import Job

GROUPS = ("scale", "headline", "frontier", "seeds", "lr", "optimizer", "embed", "layers", "refit", "hybrid")
GAP_GROUPS = ("gap", "gap-seed1", "gap-seed2")  # asked for by name; each compared with its own references
ALL_GROUPS = GROUPS + GAP_GROUPS


@dataclass(frozen=True)
class PlanShape:
    base: RunSpec  # the subspace baseline: fixed U, the plan's lr, k = d/16
    steps: int  # steps of the frontier and the ablations
    headline_steps: int
    scale_steps: int
    scale_widths: tuple[int, ...]
    scale_ratio: int  # k = d / scale_ratio in the scale group
    refit_interval: int  # the re-fit interval of the frontier's re-fitted rows


def _cpu_base() -> RunSpec:
    return RunSpec(name="cpu", vocab=256, d_model=128, n_layers=4, n_heads=4, d_ff=344, seq_len=64,
                   stage_layers=(2, 1, 1), codec="subspace", rank=8, wire_dtype="bf16", batch_size=16,
                   microbatch_size=16, lr=2e-3, warmup_steps=50, total_steps=1200, basis_updates=False)


def plan_shape(plan: str) -> PlanShape:
    if plan == "gpu":
        # one microbatch of 32 x 256 per step: the same batch as the preset's 4 x 8, a quarter of the launches;
        # the published method (every stage at the lr), which the plan's levers each change one thing of
        base = preset("small", codec="subspace", dtype="bf16", microbatch_size=32, basis_updates=False,
                      total_steps=1000, constrained_stage_lr_scale=1.0)
        return PlanShape(base, 1000, 2000, 2500, (256, 512, 1024), 100, 100)
    if plan == "cpu":
        return PlanShape(_cpu_base(), 1200, 1200, 1200, (64, 128, 256), 16, 100)
    if plan == "smoke":
        base = RunSpec(name="smoke", d_model=64, n_layers=4, n_heads=2, d_ff=64, seq_len=16, stage_layers=(2, 1, 1),
                       rank=4, wire_dtype="bf16", batch_size=4, microbatch_size=4, lr=3e-3, warmup_steps=2,
                       total_steps=8, basis_updates=False)
        return PlanShape(base, 8, 8, 8, (64, 128), 16, 4)
    raise ValueError(f"unknown plan {plan!r}; choose gpu, cpu or smoke.")


def refit(spec: RunSpec, interval: int, **kw) -> RunSpec:
    return spec.replace(basis_updates=True, basis_interval=interval,
                        basis_switch_delay=max(1, min(10, interval // 2)), **kw)


def dense(spec: RunSpec, **kw) -> RunSpec:
    return spec.with_codec("dense", basis_updates=False, **kw)


def _job(name: str, group: str, spec: RunSpec, priority: int, note: str = "") -> Job:
    return Job(name, group, spec, priority, note)


def scale_jobs(s: PlanShape, priority: int = 0) -> list[Job]:
    """Dense and subspace at k = max(2, d / scale_ratio) per width; lr ~ 1/sqrt(d) around the base's at its d."""
    out = []
    for d in sorted(s.scale_widths, reverse=True):  # the longest first: they bound the makespan
        heads = max(2, d // 64) if d >= 128 else 2
        k = max(2, round(d / s.scale_ratio))
        lr = s.base.lr * (s.base.d_model / d) ** 0.5
        spec = s.base.replace(d_model=d, n_heads=heads, d_ff=int(d * s.base.d_ff / s.base.d_model) // 8 * 8, rank=k,
                              lr=lr, total_steps=s.scale_steps)
        out.append(_job(f"d={d} dense", "scale", dense(spec), priority))
        out.append(_job(f"d={d} subspace k={k}", "scale", spec, priority, f"{d / k:.0f}x"))
    return out


def frontier_jobs(s: PlanShape, priority: int = 2, rest: int = 4) -> list[Job]:
    """`priority`: dense, the fixed-U rows and the re-fit at d/16 (the ablations' references);
    `rest` (after the ablations): the other re-fits, the bottleneck and the int8 rows."""
    d, out = s.base.d_model, [_job("dense", "frontier", dense(s.base), priority)]
    for div in (64, 32, 16, 8):
        k = max(1, d // div)
        out.append(_job(f"subspace k={k} fixed U", "frontier", s.base.replace(rank=k), priority))
        out.append(_job(f"subspace k={k} re-fit/{s.refit_interval}", "frontier",
                        refit(s.base.replace(rank=k), s.refit_interval), priority if div == 16 else rest))
        out.append(_job(f"bottleneck b={k}", "frontier", s.base.with_codec("bottleneck", rank=k), rest))
    for div in (32, 16, 8, 4):  # twice the rank in int8 at about the same bytes as bf16 at half of it
        k = max(1, d // div)
        out.append(_job(f"subspace int8 k={k} fixed U", "frontier", s.base.replace(rank=k, quant="int8"), rest,
                        "int8 payload, one bf16 absmax scale per token"))
    return out


def seed_jobs(s: PlanShape, priority: int = 2) -> list[Job]:
    """The baseline and dense again with other seeds (U, T_fixed and the weights; same data): how far
    apart two draws of the same configuration end, the noise every other comparison must beat."""
    out = []
    for seed in (1, 2):
        out.append(_job(f"dense seed {seed}", "seeds", dense(s.base, seed=seed), priority))
        out.append(_job(f"subspace seed {seed}", "seeds", s.base.replace(seed=seed), priority))
    return out


def lr_jobs(s: PlanShape, priority: int = 3) -> list[Job]:
    out = []
    for m in (0.25, 0.5, 2.0, 4.0):
        out.append(_job(f"dense lr x{m:g}", "lr", dense(s.base, lr=s.base.lr * m), priority))
        out.append(_job(f"subspace lr x{m:g}", "lr", s.base.replace(lr=s.base.lr * m), priority))
    return out


def optimizer_jobs(s: PlanShape, priority: int = 3) -> list[Job]:
    return [_job("v not scaled by d/k", "optimizer", s.base.replace(v_scale_by_rank=False), priority,
                 "v = mean over the d rows: steps sqrt(d/k) larger in the k coordinates"),
            _job("reparam W = U A (elementwise v)", "optimizer", s.base.replace(subspace_mode="reparam"), priority,
                 "plain AdamW on A [k, n]: one v per coordinate")]


def embed_jobs(s: PlanShape, priority: int = 3) -> list[Job]:
    return [_job("per-stage token tables", "embed", s.base.replace(embed_split="per_stage"), priority,
                 "every stage adds its own trainable [V, d] table (exact)")]


def layer_jobs(s: PlanShape, priority: int = 3) -> list[Job]:
    """The same layers cut so that the free last stage holds more of them (fewer constrained)."""
    L, n = s.base.n_layers, s.base.n_stages
    out = []
    for free in sorted({L // 2, L - n + 1} - set(range(s.base.stage_layers[-1] + 1))):
        head = L - free
        layout = tuple(head // (n - 1) + (1 if i < head % (n - 1) else 0) for i in range(n - 1)) + (free,)
        out.append(_job(f"{head} of {L} layers constrained {'-'.join(map(str, layout))}", "layers",
                        s.base.replace(stage_layers=layout), priority))
    free = s.base.stage_layers[-1]
    out.append(_job(f"dense with only the {free} free layer(s)", "layers",
                    dense(s.base, n_layers=free, stage_layers=(free,)), priority,
                    "the floor: what the subspace model would reach if its constrained layers added nothing"))
    return out


def refit_jobs(s: PlanShape, priority: int = 3) -> list[Job]:
    """The grad_cov row at the same interval is the frontier's re-fitted row at k = d/16."""
    i, short = s.refit_interval, max(2, s.refit_interval // 4)
    out = [_job(f"{stat} every {i}", "refit", refit(s.base, i, refit_statistic=stat), priority)
           for stat in ("act_cov", "riemannian")]
    out.append(_job(f"riemannian every {short}", "refit", refit(s.base, short, refit_statistic="riemannian"),
                    priority))
    out.append(_job(f"riemannian every {i}, angle 0.2", "refit",
                    refit(s.base, i, refit_statistic="riemannian", grassmann_eta=0.2, grassmann_max_angle=0.2),
                    priority))
    out.append(_job(f"grad_cov every {i}, angle 0.2", "refit",
                    refit(s.base, i, grassmann_eta=0.2, grassmann_max_angle=0.2), priority))
    return out


def hybrid_jobs(s: PlanShape, priority: int = 3) -> list[Job]:
    """Issue 24's hybrid at the plan's numbers per token (k = d/16 in all): 3/4 of them exact subspace
    coordinates, 1/4 a trained bottleneck of what the (free) stages write outside span(U), with and without
    the stage lr x0.03 and with the hybrid's tuned defaults at 16x (stages lr x0.1, 3x the warm-up; fidelity.md
    3n), beside the subspace codec with x0.03 (its default from d=512 up) and dense."""
    low = dict(constrained_stage_lr_scale=0.03)
    tuned = dict(constrained_stage_lr_scale=HYBRID_STAGE_LR_SCALE,
                 warmup_steps=HYBRID_WARMUP_SCALE * s.base.warmup_steps)
    k = s.base.rank - max(1, s.base.rank // 4)
    b = s.base.rank - k
    return [_job("dense", "hybrid", dense(s.base), priority),
            _job(f"subspace k={s.base.rank}, stages lr x0.03", "hybrid", s.base.replace(**low), priority),
            _job(f"hybrid k={k} b={b}", "hybrid", s.base.replace(rank=k, residual_width=b), priority,
                 "free stages; b numbers a token of a trained bottleneck beside the k exact"),
            _job(f"hybrid k={k} b={b}, stages lr x0.03", "hybrid", s.base.replace(rank=k, residual_width=b, **low),
                 priority, "free stages; b numbers a token of a trained bottleneck beside the k exact"),
            _job(f"hybrid k={k} b={b}, stages lr x0.1, warm-up x3", "hybrid",
                 s.base.replace(rank=k, residual_width=b, **tuned), priority, "the hybrid's defaults at 16x")]


def gap_jobs(s: PlanShape, seed: int, group: str, priority: int = 2) -> list[Job]:
    """Why the constrained layers add nothing, at one seed: the references (dense, the baseline, the
    dense floor of the free last stage), then one cause each. The subspace codec is exact, so a
    boundary costs only its constraint on the layers before it: "3-3-2 with the second boundary
    dense" is the layout 3-5 (stage 1 has no compressed boundary after it, so it is free), "with
    the first boundary dense" is 6-2; both boundaries at full width keep the constraint on all six
    (`Job.boundary = "full"`: the constraint without the compression). Jobs at `priority + 1`
    (the lr multipliers away from the first seed's findings, 1-1-6, per-stage tables at 3-5) run
    after the others of the same seed."""
    b = s.base.replace(seed=seed)
    L, free = b.n_layers, b.stage_layers[-1]
    head = sum(b.stage_layers[:-1])
    rest = L - head // 2
    first, later = priority, priority + 1
    out = [_job("dense", group, dense(b), first),
           _job(f"subspace k={b.rank} fixed U", group, b, first, "the baseline"),
           _job(f"dense with only the {free} free layer(s)", group, dense(b, n_layers=free, stage_layers=(free,)),
                first, "the floor of the baseline")]
    for layout in ((head, free), (head // 2, rest), (2, L - 2)):
        out.append(_job(f"one boundary, layers {layout[0]}-{layout[1]}", group, b.replace(stage_layers=layout),
                        first, f"{layout[0]} of {L} layers constrained"))
    out.append(_job(f"layers 1-1-{L - 2}", group, b.replace(stage_layers=(1, 1, L - 2)), later,
                    "2 constrained, two boundaries"))
    out.append(_job(f"dense with only {rest} layers", group, dense(b, n_layers=rest, stage_layers=(rest,)), first,
                    f"the floor of layers {head // 2}-{rest}"))
    out.append(_job(f"one boundary, layers {head // 2}-{rest}, per-stage token tables", group,
                    b.replace(stage_layers=(head // 2, rest), embed_split="per_stage"), later,
                    "the free stage adds its own trainable [V, d] table"))
    out.append(Job("full-width boundaries", group, b, first,
                   "the constraint without the compression: each boundary sends h (d numbers)", boundary="full"))
    for m in (0.25, 0.5, 2.0, 4.0, 8.0):
        out.append(_job(f"constrained weights lr x{m:g}", group, b.replace(constrained_lr_scale=m),
                        first if m == 4.0 else later, "w_o, w_down and T_S of stages 0..n-2"))
    for m in (0.25, 0.5, 2.0, 4.0, 8.0):
        out.append(_job(f"constrained stages lr x{m:g}", group, b.replace(constrained_stage_lr_scale=m),
                        first if m in (2.0, 4.0) else later, "every parameter of stages 0..n-2"))
    for m in (0.001, 0.01, 0.03, 0.1):
        out.append(_job(f"constrained stages lr x{m:g}", group, b.replace(constrained_stage_lr_scale=m), later,
                        "stages 0..n-2 about frozen at their initial weights" if m == 0.001 else
                        "every parameter of stages 0..n-2"))
    out.append(_job("constrained weights lr x0.001", group, b.replace(constrained_lr_scale=0.001), later,
                    "w_o, w_down and T_S about frozen, the rest of stages 0..n-2 trained"))
    for std in (0.1, 0.3, 1.0):
        out.append(_job(f"T_fixed std {std:g}", group, b.replace(t_fixed_std=std), later,
                        "the frozen token code larger (default 0.02)"))
    out.append(_job(f"one boundary, layers {head // 2}-{rest}, constrained stage lr x0.001", group,
                    b.replace(stage_layers=(head // 2, rest), constrained_stage_lr_scale=0.001), later,
                    "stage 0 about frozen"))
    return out


def gap_third_seed_jobs(s: PlanShape, seed: int = 2, priority: int = 3) -> list[Job]:
    """A third seed for the rows whose two seeds disagreed most: the one-boundary layout that constrains
    half the non-last layers, with and without per-stage tables, its dense floor, and dense."""
    half = sum(s.base.stage_layers[:-1]) // 2
    rest = s.base.n_layers - half
    layout = f"one boundary, layers {half}-{rest}"
    keep = {"dense", layout, f"{layout}, per-stage token tables", f"dense with only {rest} layers"}
    return [j for j in gap_jobs(s, seed, f"gap-seed{seed}", priority) if j.name in keep]


def headline_jobs(s: PlanShape, best: dict | None = None, priority: int = 1) -> list[Job]:
    """`small` at the issue's length: dense, the issue's subspace defaults, and `best` (RunSpec overrides
    the ablations chose), each at 16x."""
    base = s.base.replace(total_steps=s.headline_steps)
    out = [_job("dense", "headline", dense(base), priority),
           _job("subspace k=d/16, issue defaults", "headline", base, priority)]
    if best:
        out.append(_job("subspace k=d/16, best settings", "headline", base.replace(**best), priority, str(best)))
    return out


def jobs_for(plan: str, groups: tuple[str, ...] = GROUPS, best: dict | None = None) -> list[Job]:
    s = plan_shape(plan)
    make = {"scale": scale_jobs, "frontier": frontier_jobs, "seeds": seed_jobs, "lr": lr_jobs,
            "optimizer": optimizer_jobs, "embed": embed_jobs, "layers": layer_jobs, "refit": refit_jobs,
            "headline": lambda s: headline_jobs(s, best), "gap": lambda s: gap_jobs(s, 0, "gap", 2),
            "gap-seed1": lambda s: gap_jobs(s, 1, "gap-seed1", 3), "gap-seed2": gap_third_seed_jobs,
            "hybrid": hybrid_jobs}
    unknown = sorted(set(groups) - set(make))
    if unknown:
        raise ValueError(f"unknown groups {', '.join(unknown)}; choose among {', '.join(ALL_GROUPS)}.")
    jobs = [j for g in ALL_GROUPS if g in groups for j in make[g](s)]
    for j in jobs:  # the ablations and the frontier train the plan's step count
        if j.group not in ("scale", "headline"):
            j.spec = j.spec.replace(total_steps=s.steps)
    keys = [j.key for j in jobs]
    assert len(set(keys)) == len(keys), "every job of a plan needs its own group/name"
    return jobs


def with_dense_repeats(jobs: list[Job], n: int) -> list[Job]:
    """Every dense job (spec.codec "dense") followed by n - 1 copies of it, the same spec, named f"{name} (run i)"
    for i = 2..n: dense on a GPU is not bit-repeatable (docs/fidelity.md 3m), so the report takes the mean of
    the n runs as the reference (report.py). n = 1: the jobs as they are."""
    if n < 1:
        raise ValueError(f"the number of dense runs must be at least 1, not {n}.")
    out = []
    for j in jobs:
        out.append(j)
        if j.spec.codec == "dense":
            out += [replace(j, name=f"{j.name} (run {i})") for i in range(2, n + 1)]
    assert len({j.key for j in out}) == len(out), "every job of a plan needs its own group/name"
    return out

"""`RunSpec`: the frozen description of one training run.

Every peer builds its stage from the spec alone (model shape, layer ranges, codec, seeds,
optimizer, schedule), so two peers with the same spec hold bit-identical initial weights
and shared constants. The spec's hash names the run; messages carry it.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

CODECS = ("dense", "subspace", "bottleneck")
# the dtype names a run spec may use, and the torch dtype each one means (the one place they are spelled)
WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}
QUANTS = ("none", "int8")
# "bf16" and "fp16": matmuls and attention in that dtype under autocast; weights, optimizer state, the
# residual stream and boundary tensors stay in fp32 (protocol/model.py `compute_dtype`, `autocast_dtype`);
# "fp16" also scales the loss (protocol/loss_scale.py). A spec names one of these, never "auto": `resolve_dtype`
COMPUTE_DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_CHOICES = (*COMPUTE_DTYPES, "auto")  # what a --dtype flag takes
SUBSPACE_MODES = ("project", "reparam")
# docs/fidelity.md: "subspace" = T_fixed + T_S (rows of T_S in span(U)); "per_stage" adds, on every stage, an
# untied trainable [V, d] token table that the stage adds on entry and takes off again before its encoder
EMBED_SPLITS = ("subspace", "per_stage")
# the statistic receiving stages send for a re-fit of U (docs/algorithms.md 1.7, docs/fidelity.md)
REFIT_STATISTICS = ("grad_cov", "act_cov", "riemannian")
REPLICA_SYNCS = ("exact", "powersgd")  # how a stage's replicas agree on a step's gradient (algorithms.md 5)
# the subspace codec's own numeric options (docs/fidelity.md 3d), and their defaults: another codec refuses them
SUBSPACE_OPTIONS: dict[str, float] = {"constrained_lr_scale": 1.0, "t_fixed_std": 0.02}
# with the stage lr, which every codec takes (3j): the numeric options added after runs were signed
LR_OPTIONS: dict[str, float] = {**SUBSPACE_OPTIONS, "constrained_stage_lr_scale": 1.0}
# fields added after runs were signed: left out of `to_dict` (and so of the run hash) while they hold this
# default, so every spec written before them keeps its hash (and a bench's --resume its finished jobs)
# the slowest uplink a swarm waits for, bit/s (peer/daemon/transfer_time.py):
# 8 Mbit/s, below most home uplinks, 1/10 of the
# 80 Mbit/s the design targets
SLOWEST_UPLINK_BPS = 8e6
HASH_NEUTRAL_DEFAULTS: dict[str, Any] = {**LR_OPTIONS, "microbatches_in_flight": 0, "replica_sync_warmup": 0,
                                         "residual_width": 0, "constrained_stage_lr_end": 0.0,
                                         "slowest_uplink_bps": SLOWEST_UPLINK_BPS}
# the weight of the re-fit statistic's EMA that its window may leave out (`RunSpec.stat_window`)
STAT_TAIL = 1e-6
# The subspace codec's stage lr in the presets (`preset`; docs/fidelity.md 3d-3g, 5): its stages before the last
# at 0.03 x the lr took the gap to dense at 16x from +18.0% to +6.7% at d=512 (two seeds) and from +16.3% to
# +0.1% at d=1024 in 8 stages (one seed; -0.9% and +0.8% on two seeds in the record setting), and the record
# setting's time to dense's loss to 5.2-5.8x sooner; at d=256 it hurt (+7.2% against +4.9%, one seed), hence
# the width from which it applies.
STAGE_LR_FROM_WIDTH = 512
STAGE_LR_SCALE = 0.03
# A hybrid sending at most HYBRID_TUNED_RATIO x fewer numbers than d warms up over 3x the preset's steps (lower loss
# on every seed at small 16x, fidelity.md 3k) and its stages, free, train a little faster than the subspace codec's:
# with that warm-up 0.1 beat 0.03 on 4 of 5 seeds at 16x (+2.0% against +3.6%), on both at 2x the tokens, and tied
# in the record shape; 0.05, 0.15, 0.2 did worse. At ~100x both made it worse (3n), so a narrower hybrid keeps the
# subspace codec's stage lr and the preset's warm-up.
HYBRID_TUNED_RATIO = 16
HYBRID_WARMUP_SCALE = 3
HYBRID_STAGE_LR_SCALE = 0.1


class SpecError(ValueError):
    """A run spec that cannot describe a valid run; the message says which field to fix."""


def in_stat_window(step: int, interval: int, window: int) -> bool:
    """Whether step `step` (0-based) is one of the `window` steps before a re-fit, which follows the step whose
    count step + 1 is a multiple of `interval`."""
    return (-(step + 1)) % interval < window


@dataclass(frozen=True)
class RunSpec:
    name: str = "tiny"
    # model
    vocab: int = 256
    d_model: int = 128
    n_layers: int = 6
    n_heads: int = 4
    d_ff: int = 256
    seq_len: int = 64
    stage_layers: tuple[int, ...] = (2, 2, 2)
    # boundary compression
    codec: str = "subspace"
    rank: int = 16  # k for subspace, b for bottleneck; ignored by dense
    # the hybrid (issue 24 item 2): a subspace run that also sends b numbers per token of a learned
    # bottleneck of the residual's part outside span(U); its stages are then free (no weight is kept in
    # span(U)), the k coordinates stay exact and the b are lossy (protocol/codecs.py). 0 = off
    residual_width: int = 0
    wire_dtype: str = "fp32"
    quant: str = "none"
    subspace_mode: str = "project"  # docs/algorithms.md 1.5(a) "project" or 1.5(c) "reparam"
    v_scale_by_rank: bool = True  # docs/algorithms.md 1.5(a) finding (i): scale v by d/k
    embed_split: str = "subspace"  # EMBED_SPLITS: which part of the token embedding is trainable, and where
    dtype: str = "fp32"  # compute dtype of every stage: fp32, fp64 (exactness tests), bf16 or fp16 (autocast, fp32
    # master weights; fp16 with dynamic loss scaling). One for the whole run: replicas must compute alike
    # seeds
    seed: int = 0  # weights, U and T_fixed
    data_seed: int = 1234
    # optimizer and schedule
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # per-stage global norm; 0 disables
    warmup_steps: int = 20
    total_steps: int = 0  # cosine decay to min_lr_ratio*lr over this many steps; 0 = constant
    min_lr_ratio: float = 0.1
    # batch
    batch_size: int = 16  # sequences per optimizer step
    microbatch_size: int = 8
    # how many of a head's microbatches are between their forward and their gradient's return at once (the
    # head starts the next as one comes back); 0 = all of its share at once. It bounds every stage's saved
    # activations (peer/runner/memory_estimate.py), so a step of many microbatches fits a card (issue 22 item 2)
    microbatches_in_flight: int = 0
    # Grassmann basis updates (docs/algorithms.md 1.7)
    basis_interval: int = 500  # steps between re-fits of U
    basis_updates: bool = True  # False keeps U fixed for the whole run
    basis_switch_delay: int = 10  # a re-fit computed after step t takes effect at step t + delay
    grassmann_eta: float = 0.05  # retraction step (radians-ish, before the angle cap)
    grassmann_max_angle: float = 0.05  # cap on the largest principal angle of one update
    stats_decay: float = 0.9  # EMA decay per step of the statistic M_s, kept in the stat_window steps before a re-fit
    refit_statistic: str = "grad_cov"  # REFIT_STATISTICS: what M_s is (docs/algorithms.md 1.7)
    # replicas of a stage (docs/algorithms.md 5): "exact" sums their gradients every step;
    # "powersgd" sums a rank-r PowerSGD approximation with error feedback (for home uplinks)
    replica_sync: str = "exact"
    # r of "powersgd". On `small` (one H200, 3 seeds, 200 steps) 8 ends +13.8% of held-out loss over exact, 32 +2.9%,
    # 64 +1.1%; but a replica sends its factors to each other replica of its stage, and a simulated `large` swarm of
    # home GPUs at 80 Mbit/s makes 0.34-0.55x the tokens/s at 32 that it makes at 8: 8 reaches a loss sooner there
    # (docs/benchmarks.md, replica sync)
    replica_sync_rank: int = 8
    # "powersgd": the first this-many steps sum the replicas' gradients exactly, as "exact" does (the start of
    # training is the most sensitive to compressed gradients: torch's PowerSGD hook's start_powerSGD_iter)
    replica_sync_warmup: int = 0
    # per-parameter lr multipliers (docs/fidelity.md 3d), on top of the schedule: `constrained_stage_lr_scale`
    # for every parameter of a stage before the last (any codec: 3j), `constrained_lr_scale` (compounded; the
    # subspace codec only) for the weights kept in span(U) (w_o, w_down, T_S). 1.0 = off
    constrained_lr_scale: float = 1.0
    constrained_stage_lr_scale: float = 1.0
    # > 0: the stage lr multiplier moves linearly from `constrained_stage_lr_scale` at the warm-up's end to this at
    # total_steps (protocol/optim.py `stage_lr_ratio`; docs/fidelity.md 3p); 0 = it holds for the whole run
    constrained_stage_lr_end: float = 0.0
    # standard deviation of the frozen token code T_fixed's entries (protocol/subspace.py; docs/fidelity.md 3d:
    # what the constrained stages write grows to ~40x its norm at the default 0.02 on `small`)
    t_fixed_std: float = 0.02
    # the slowest uplink every peer of the swarm waits for, bit/s (peer/daemon/transfer_time.py):
    # a wait for bytes is a fixed
    # allowance plus their time at this rate, and a replica slower than it is cut. A swarm rule, not a peer's choice:
    # replicas that waited for different floors would give up on one another at different times
    slowest_uplink_bps: float = SLOWEST_UPLINK_BPS
    # the coordinator's public key (hex); empty until a coordinator signs the spec
    coordinator_key: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage_layers", tuple(int(x) for x in self.stage_layers))
        object.__setattr__(self, "betas", tuple(float(x) for x in self.betas))
        for name in (*LR_OPTIONS, "constrained_stage_lr_end", "slowest_uplink_bps"):  # 2 and 2.0 must hash alike
            object.__setattr__(self, name, float(getattr(self, name)))
        # counts, whatever a spec file wrote
        for name in ("microbatches_in_flight", "replica_sync_warmup", "residual_width"):
            object.__setattr__(self, name, int(getattr(self, name)))
        self.validate()

    # ----- derived quantities
    @property
    def n_stages(self) -> int:
        return len(self.stage_layers)

    @property
    def refits_basis(self) -> bool:
        """Whether the coordinator re-fits the subspace basis: a subspace run with basis updates and a
        boundary to fit it to (a one-stage swarm, pure data parallel, sends no activations)."""
        return self.codec == "subspace" and self.basis_updates and self.n_stages > 1

    @property
    def n_microbatches(self) -> int:
        return self.batch_size // self.microbatch_size

    def powersgd_at(self, step: int) -> bool:
        """Whether step `step` (0-based) sums replicas' gradients as PowerSGD factors: a "powersgd" run
        past its `replica_sync_warmup` exact steps."""
        return self.replica_sync == "powersgd" and step >= self.replica_sync_warmup

    @property
    def max_in_flight(self) -> int:
        """Microbatches one head has between forward and gradient at once: `microbatches_in_flight`,
        or the whole step's when that is 0 or more."""
        return min(self.microbatches_in_flight or self.n_microbatches, self.n_microbatches)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def boundary_width(self) -> int:
        """Numbers per token that cross a stage boundary (before wire dtype)."""
        return self.d_model if self.codec == "dense" else self.rank + self.residual_width

    @functools.cached_property
    def stat_window(self) -> int:
        """How many steps before each re-fit the receiving stages collect (and replicas exchange) the re-fit
        statistic: W = min(basis_interval, ceil(ln STAT_TAIL / ln stats_decay)), 132 at the default decay 0.9.
        The EMA restarts at zero W steps before the re-fit, which leaves out stats_decay^W <= STAT_TAIL of its
        weight, and the other steps neither compute the statistic nor send its d x k float64 numbers
        (docs/algorithms.md 1.7)."""
        if self.stats_decay <= 0:
            return 1
        return min(self.basis_interval, math.ceil(math.log(STAT_TAIL) / math.log(self.stats_decay)))

    def in_stat_window(self, step: int) -> bool:
        """Whether step `step` (0-based) is one of the `stat_window` steps before a re-fit (`in_stat_window`)."""
        return in_stat_window(step, self.basis_interval, self.stat_window)

    @property
    def hybrid(self) -> bool:
        """A subspace run with a bottleneck of the residual beside its k exact coordinates: free stages."""
        return self.codec == "subspace" and self.residual_width > 0

    def layer_range(self, stage: int) -> range:
        if not 0 <= stage < self.n_stages:
            raise SpecError(f"stage {stage} does not exist: this run has stages 0..{self.n_stages - 1}.")
        start = sum(self.stage_layers[:stage])
        return range(start, start + self.stage_layers[stage])

    # ----- validation
    def validate(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise SpecError(msg)

        need(self.codec in CODECS, f"codec must be one of {', '.join(CODECS)}, not {self.codec!r}.")
        need(self.wire_dtype in WIRE_DTYPES, f"wire_dtype must be one of {', '.join(WIRE_DTYPES)}.")
        need(self.quant in QUANTS, f"quant must be one of {', '.join(QUANTS)}.")
        need(self.dtype in COMPUTE_DTYPES, f"dtype must be one of {', '.join(COMPUTE_DTYPES)} (\"auto\" is resolved "
             f"before a spec is made: protocol/spec.py resolve_dtype), not {self.dtype!r}.")
        need(self.subspace_mode in SUBSPACE_MODES, f"subspace_mode must be one of {SUBSPACE_MODES}.")
        need(self.embed_split in EMBED_SPLITS, f"embed_split must be one of {', '.join(EMBED_SPLITS)}.")
        need(self.embed_split == "subspace" or self.codec == "subspace",
             f"embed_split {self.embed_split!r} needs the subspace codec; use embed_split \"subspace\" with "
             f"codec {self.codec!r}.")
        need(self.refit_statistic in REFIT_STATISTICS,
             f"refit_statistic must be one of {', '.join(REFIT_STATISTICS)}.")
        need(2 <= self.vocab <= 2**31 - 1, "vocab must be between 2 and 2^31-1.")
        need(self.d_model > 0 and self.n_heads > 0, "d_model and n_heads must be positive.")
        need(self.d_model % self.n_heads == 0, f"d_model {self.d_model} must divide by n_heads {self.n_heads}.")
        need(self.head_dim % 2 == 0, "d_model / n_heads must be even for RoPE.")
        need(self.d_ff > 0 and self.seq_len > 0, "d_ff and seq_len must be positive.")
        need(len(self.stage_layers) >= 1 and all(n >= 1 for n in self.stage_layers),
             "every stage needs at least one layer.")
        need(sum(self.stage_layers) == self.n_layers,
             f"stage_layers {list(self.stage_layers)} must add up to n_layers {self.n_layers}.")
        if self.codec != "dense":
            need(1 <= self.rank <= self.d_model, f"rank must be in 1..d_model ({self.d_model}), not {self.rank}.")
        need(self.residual_width >= 0, f"residual_width must be 0 (off) or a number of values per token, not "
             f"{self.residual_width}.")
        if self.residual_width:
            need(self.codec == "subspace", f"residual_width is the subspace codec's hybrid; leave it at 0 with codec "
                 f"{self.codec!r} (the bottleneck codec's width is rank).")
            need(self.rank + self.residual_width <= self.d_model, f"rank + residual_width must be at most d_model "
                 f"({self.d_model}), not {self.rank} + {self.residual_width}.")
            need(not self.basis_updates, "the hybrid (residual_width > 0) keeps U fixed: set basis_updates false "
                 "(a re-fit's statistic is of the k exact coordinates only).")
            need(self.subspace_mode == "project" and self.embed_split == "subspace",
                 "the hybrid (residual_width > 0) has free stages: use subspace_mode \"project\" and embed_split "
                 "\"subspace\".")
        need(self.microbatch_size >= 1 and self.batch_size >= self.microbatch_size
             and self.batch_size % self.microbatch_size == 0,
             "batch_size must be a positive multiple of microbatch_size.")
        need(self.lr > 0 and 0 <= self.betas[0] < 1 and 0 <= self.betas[1] < 1, "lr > 0 and betas in [0, 1).")
        need(self.basis_interval >= 1, "basis_interval must be at least 1 step.")
        need(1 <= self.basis_switch_delay < self.basis_interval or not self.basis_updates,
             "basis_switch_delay must be at least 1 and less than basis_interval.")
        need(self.grassmann_eta > 0 and 0 < self.grassmann_max_angle <= 1.0 and 0 <= self.stats_decay < 1,
             "grassmann_eta > 0, grassmann_max_angle in (0, 1] and stats_decay in [0, 1) are required.")
        need(self.warmup_steps >= 0 and self.total_steps >= 0, "warmup_steps and total_steps must be >= 0.")
        need(self.replica_sync in REPLICA_SYNCS,
             f"replica_sync must be one of {', '.join(REPLICA_SYNCS)}, not {self.replica_sync!r}.")
        need(1 <= self.replica_sync_rank <= 1024, "replica_sync_rank must be between 1 and 1024.")
        need(0 <= self.replica_sync_warmup < 2**31, f"replica_sync_warmup must be a number of steps >= 0, not "
             f"{self.replica_sync_warmup}.")
        need(0 < self.slowest_uplink_bps < float("inf"), f"slowest_uplink_bps must be a rate in bit/s above 0 (the "
             f"slowest uplink the swarm waits for), not {self.slowest_uplink_bps}.")
        need(self.replica_sync_warmup == 0 or self.replica_sync == "powersgd",
             "replica_sync_warmup is the number of exact steps before powersgd; use it with replica_sync powersgd.")
        need(0 <= self.microbatches_in_flight <= 1_000_000, "microbatches_in_flight must be 0 (all of a head's "
             f"share at once) or a positive number, not {self.microbatches_in_flight}.")
        for name, default in LR_OPTIONS.items():
            value = getattr(self, name)
            need(0 < value <= 1000, f"{name} must be in (0, 1000], not {value}.")
            need(value == default or self.codec == "subspace" or name not in SUBSPACE_OPTIONS,
                 f"{name} is an option of the subspace codec; leave it at {default} with codec {self.codec!r}.")
        end = self.constrained_stage_lr_end
        need(end == 0 or 0 < end <= 1000, f"constrained_stage_lr_end must be 0 (no ramp) or in (0, 1000], not {end}.")
        need(end == 0 or self.total_steps > self.warmup_steps, "constrained_stage_lr_end ramps the stage lr from the "
             "warm-up's end to total_steps; set total_steps above warmup_steps, or leave it at 0.")

    # ----- identity
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name, default in HASH_NEUTRAL_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        d["stage_layers"] = list(self.stage_layers)
        d["betas"] = list(self.betas)
        return d

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces): what is hashed and what travels."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def run_hash(self) -> str:
        # cached: every message header and every inbound check asks for it (the spec is frozen)
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown run spec fields: {', '.join(unknown)}; remove them or check the spelling.")
        try:
            return cls(**data)
        except TypeError as e:
            raise SpecError(f"bad run spec: {e}.") from e

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"run spec is not valid JSON ({e}).") from e
        if not isinstance(data, dict):
            raise SpecError("run spec JSON must be an object.")
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def with_codec(self, codec: str, **changes: Any) -> RunSpec:
        """This run with another codec: switching away from the subspace codec puts its own options
        (the lr multipliers, T_fixed's scale, the embedding split, the hybrid's residual width) back at
        their defaults (the other codecs refuse all but the stage lr, which is reset too: another codec's
        run names its own); `changes` apply on top."""
        if codec != "subspace":
            changes = {**LR_OPTIONS, "constrained_stage_lr_end": 0.0, "embed_split": "subspace", "residual_width": 0,
                       **changes}
        return self.replace(codec=codec, **changes)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        if path.suffix == ".toml":
            path.write_text(_to_toml(self.to_dict()))
        else:
            path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> RunSpec:
        path = Path(path)
        if not path.is_file():
            raise SpecError(f"run spec file {path} does not exist.")
        if path.suffix == ".toml":
            try:
                return cls.from_dict(tomllib.loads(path.read_text()))
            except tomllib.TOMLDecodeError as e:
                raise SpecError(f"run spec {path} is not valid TOML ({e}).") from e
        return cls.from_json(path.read_text())


def _to_toml(d: dict[str, Any]) -> str:
    lines, tables = [], []
    for k, v in sorted(d.items()):
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    for k, v in tables:
        lines.append(f"\n[{k}]")
        lines.extend(f"{kk} = {json.dumps(vv)}" for kk, vv in sorted(v.items()))
    return "\n".join(lines) + "\n"


PRESETS: dict[str, dict[str, Any]] = {
    # CPU tests and the laptop demo: seconds per hundred steps.
    "tiny": dict(name="tiny", d_model=128, n_layers=6, n_heads=4, d_ff=256, seq_len=64,
                 stage_layers=(2, 2, 2), rank=16, batch_size=16, microbatch_size=8, lr=3e-3),
    # A real-sized boundary on a CPU box or a small GPU: d=512 (k=32: 16x, bf16 wire).
    "small": dict(name="small", d_model=512, n_layers=8, n_heads=8, d_ff=1376, seq_len=256,
                  stage_layers=(3, 3, 2), rank=32, wire_dtype="bf16", batch_size=32,
                  microbatch_size=8, lr=1e-3, warmup_steps=100),
    # GPU-sized: d=2048, k=20 (~100x), one stage per GPU.
    "large": dict(name="large", d_model=2048, n_layers=16, n_heads=16, d_ff=5504, seq_len=1024,
                  stage_layers=(4, 4, 4, 4), rank=20, wire_dtype="bf16", batch_size=32,
                  microbatch_size=4, lr=3e-4, warmup_steps=200),
    # ~1.5B (1.51e9 parameters): d=2048, 30 layers in 6 stages of 5, k=20 (~100x); a stage is ~250M.
    "xl": dict(name="xl", d_model=2048, n_layers=30, n_heads=16, d_ff=5504, seq_len=1024,
               stage_layers=(5,) * 6, rank=20, wire_dtype="bf16", batch_size=16, microbatch_size=2,
               lr=2.5e-4, warmup_steps=200),
    # The public record on slow links' shape (Pluralis' ProtocolNanoGPT: ~203M parameters, d=1024, 8 stages;
    # `swarm bench record`): 16 layers in 8 stages of 2, 2.02e8 parameters with the byte vocabulary,
    # k = d/100 = 10 (~100x, the subspace codec's default ratio), batch 64 x 256 tokens.
    "record": dict(name="record", d_model=1024, n_layers=16, n_heads=16, d_ff=2752, seq_len=256,
                   stage_layers=(2,) * 8, rank=10, wire_dtype="bf16", batch_size=64, microbatch_size=8,
                   lr=7e-4, warmup_steps=100),
    # The paper's largest shape, LLaMA-3-8B's: 32 layers, d=4096, 32 heads (no grouped-query attention
    # here: 7.8e9 parameters), d_ff=14336, 8 stages of 4 layers (~1e9 each), k=40 (~100x). Byte vocabulary,
    # like every preset. A stage fits a 24 GB card with activation checkpointing (docs/consumer-gpus.md).
    "paper8b": dict(name="paper8b", d_model=4096, n_layers=32, n_heads=32, d_ff=14336, seq_len=1024,
                    stage_layers=(4,) * 8, rank=40, wire_dtype="bf16", batch_size=8, microbatch_size=1,
                    lr=1.5e-4, warmup_steps=200),
}


def resolve_dtype(dtype: str | None, device: str | torch.device | None) -> str | None:
    """A --dtype flag's value for a run spec: "auto" is bf16 on a CUDA device that supports it
    (`torch.cuda.is_bf16_supported`: compute capability 8.0 and later), fp16 on an older CUDA card
    (GTX 10xx, RTX 20xx, T4, V100), fp32 on the CPU (or with no device); any other value as it is.
    The run spec then fixes it for every peer: replicas of a stage must compute alike to stay
    bit-identical (docs/consumer-gpus.md)."""
    if dtype != "auto":
        return dtype
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda" or not torch.cuda.is_available():
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"


def split_layers(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible, earlier stages taking the remainder."""
    if not 1 <= n_stages <= n_layers:
        raise SpecError(f"cannot cut {n_layers} layers into {n_stages} stages; use 1..{n_layers} stages.")
    base, extra = divmod(n_layers, n_stages)
    return tuple(base + (1 if i < extra else 0) for i in range(n_stages))


def preset(name: str, **overrides: Any) -> RunSpec:
    """A named preset with overrides; `stages=N` re-cuts the layers into N stages. A subspace run of
    d_model >= `STAGE_LR_FROM_WIDTH` with more than one stage trains its stages before the last at
    `STAGE_LR_SCALE` x the lr unless `constrained_stage_lr_scale` is given (1.0 is the published method).
    A hybrid (`residual_width` > 0) keeps U fixed unless `basis_updates` is given; one whose k + b numbers a
    token are at least d / `HYBRID_TUNED_RATIO` warms up over `HYBRID_WARMUP_SCALE` x the preset's warm-up
    steps unless `warmup_steps` is given, and its stage lr (from the same width) is `HYBRID_STAGE_LR_SCALE`."""
    if name not in PRESETS:
        raise SpecError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}.")
    fields = dict(PRESETS[name])
    stages = overrides.pop("stages", None)
    fields.update({k: v for k, v in overrides.items() if v is not None})
    if fields.get("basis_interval") and "basis_switch_delay" not in fields:
        fields["basis_switch_delay"] = max(1, min(10, fields["basis_interval"] // 2))
    if stages is not None:
        fields["stage_layers"] = split_layers(fields.get("n_layers", RunSpec.n_layers), stages)
    width = fields.get("rank", RunSpec.rank) + fields.get("residual_width", 0)
    tuned_hybrid = bool(fields.get("residual_width")) and width * HYBRID_TUNED_RATIO >= fields.get(
        "d_model", RunSpec.d_model)
    if ("constrained_stage_lr_scale" not in fields and fields.get("codec", RunSpec.codec) == "subspace"
            and fields.get("d_model", RunSpec.d_model) >= STAGE_LR_FROM_WIDTH
            and len(fields.get("stage_layers", RunSpec.stage_layers)) > 1):
        fields["constrained_stage_lr_scale"] = HYBRID_STAGE_LR_SCALE if tuned_hybrid else STAGE_LR_SCALE
    if fields.get("residual_width") and "basis_updates" not in fields:
        fields["basis_updates"] = False  # the hybrid keeps U fixed
    if tuned_hybrid and overrides.get("warmup_steps") is None:
        fields["warmup_steps"] = HYBRID_WARMUP_SCALE * fields.get("warmup_steps", RunSpec.warmup_steps)
    return RunSpec(**fields)

"""`RunSpec`: the frozen description of one training run.

Every peer builds its stage from the spec alone (model shape, layer ranges, codec, seeds,
optimizer, schedule), so two peers with the same spec hold bit-identical initial weights
and shared constants. The spec's hash names the run; messages carry it.

The values its fields may take are in protocol/spec_choices.py, its hash and files in
protocol/spec_identity.py, the presets' tables in protocol/presets.py; this module is the run spec's API
and re-exports what callers use of those.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

from protocol.presets import (
    HYBRID_STAGE_LR_SCALE,
    HYBRID_TUNED_RATIO,
    HYBRID_WARMUP_SCALE,
    PRESETS,
    STAGE_LR_FROM_WIDTH,
    STAGE_LR_SCALE,
    split_layers,
)
from protocol.spec_choices import (
    CODECS,
    COMPUTE_DTYPES,
    DTYPE_CHOICES,
    EMBED_SPLITS,
    LR_OPTIONS,
    QUANTS,
    REFIT_STATISTICS,
    REPLICA_SYNCS,
    SLOWEST_UPLINK_BPS,
    STAT_TAIL,
    SUBSPACE_MODES,
    SUBSPACE_OPTIONS,
    WIRE_DTYPES,
    SpecError,
    in_stat_window,
    resolve_dtype,
)
from protocol.spec_identity import SpecIdentity

# the run spec's API: what callers import from here, wherever it is defined
__all__ = ["CODECS", "COMPUTE_DTYPES", "DTYPE_CHOICES", "HYBRID_STAGE_LR_SCALE", "HYBRID_WARMUP_SCALE", "PRESETS",
           "REPLICA_SYNCS", "SLOWEST_UPLINK_BPS", "WIRE_DTYPES", "RunSpec", "SpecError", "in_stat_window", "preset",
           "resolve_dtype"]


@dataclass(frozen=True)
class RunSpec(SpecIdentity):
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

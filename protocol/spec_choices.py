"""The values a run spec's fields may take and what each means, the defaults that keep old run hashes, and
`SpecError`: what `RunSpec` (protocol/spec.py) checks against, and what flags and benches offer."""
from __future__ import annotations

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
# the slowest uplink a swarm waits for, bit/s (peer/daemon/transfer_time.py):
# 8 Mbit/s, below most home uplinks, 1/10 of the
# 80 Mbit/s the design targets
SLOWEST_UPLINK_BPS = 8e6
# fields added after runs were signed: left out of `to_dict` (and so of the run hash) while they hold this
# default, so every spec written before them keeps its hash (and a bench's --resume its finished jobs)
HASH_NEUTRAL_DEFAULTS: dict[str, Any] = {**LR_OPTIONS, "microbatches_in_flight": 0, "replica_sync_warmup": 0,
                                         "residual_width": 0, "constrained_stage_lr_end": 0.0,
                                         "slowest_uplink_bps": SLOWEST_UPLINK_BPS}
# the weight of the re-fit statistic's EMA that its window may leave out (`RunSpec.stat_window`)
STAT_TAIL = 1e-6


class SpecError(ValueError):
    """A run spec that cannot describe a valid run; the message says which field to fix."""


def in_stat_window(step: int, interval: int, window: int) -> bool:
    """Whether step `step` (0-based) is one of the `window` steps before a re-fit, which follows the step whose
    count step + 1 is a multiple of `interval`."""
    return (-(step + 1)) % interval < window


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

"""The run spec's flags (`swarm local`, `swarm coordinator`): the group that adds them, the spec they
describe (a preset with overrides, `protocol/spec.py` `preset`), and the summary line's note of the
options a spec turned on."""
from __future__ import annotations

import argparse

from protocol.spec import (
    CODECS,
    DTYPE_CHOICES,
    PRESETS,
    REPLICA_SYNCS,
    SLOWEST_UPLINK_BPS,
    RunSpec,
    preset,
    resolve_dtype,
)
from swarm.net.shaper import parse_bandwidth


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """The run spec's flags, one group, on `swarm local` and `swarm coordinator`."""
    g = p.add_argument_group("run spec (refused beside --run-spec, which sets them all)")
    g.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model size (default: tiny)")
    g.add_argument("--run-spec", metavar="FILE", help="a run spec as JSON or TOML instead of a preset")
    g.add_argument("--stages", type=int, help="number of pipeline stages (default: the preset's)")
    g.add_argument("--codec", choices=list(CODECS),
                   help="boundary compression (default: subspace)")
    g.add_argument("--rank", type=int, help="subspace rank k or bottleneck width b")
    g.add_argument("--residual-width", type=int, metavar="B",
                   help="subspace: the hybrid (issue 24): also send B numbers a token, a trained bottleneck of what "
                   "the stages write outside span(U); its stages are free and U stays fixed; lossy in those B, exact "
                   "in the k. It needs --constrained-stage-lr 0.03 (the default from d=512 up): at the full lr its "
                   "free stages train far worse; it beat the subspace codec at d=512 and lost to it at d=1024 in 8 "
                   "stages (docs/fidelity.md 3h) (default: 0, off)")
    g.add_argument("--vocab", type=int, metavar="N",
                   help="vocabulary size, e.g. 32768 to compare a BPE's width with bytes' at the same model; with "
                   "--tokens the tokenizer's, which a different N contradicts (default: the preset's, 256 but "
                   "small-bpe's 32768)")
    g.add_argument("--wire-dtype", choices=["fp32", "bf16"], help="dtype of numbers on the wire")
    g.add_argument("--quant", choices=["none", "int8"], help="int8 quantization under the codec")
    g.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="compute dtype of every peer: bf16 or fp16 (autocast, fp32 master weights; fp16 with dynamic "
                   "loss scaling), fp32 or fp64; auto: bf16 on a CUDA card that has it, fp16 on an older one, fp32 on "
                   "the CPU, judged by --device (swarm local) or by this machine's GPU (coordinator: pass bf16 or fp16 "
                   "for GPU peers if it has none) (default: auto)"),
    g.add_argument("--basis-interval", type=int, help="steps between basis re-fits (default: 500)")
    g.add_argument("--seed", type=int, help="seed of weights and shared constants")
    g.add_argument("--replica-sync", choices=list(REPLICA_SYNCS),
                   help="how replicas of a stage agree on a step's gradient: exact (sum every step; LANs) or "
                   "powersgd (rank-r factors with error feedback; home uplinks) (default: exact)")
    g.add_argument("--replica-sync-rank", type=int,
                   help="powersgd: rank r of the factors (default: 8; on small 8 ended +14%% held-out loss over "
                   "exact at equal tokens, 32 +3%%, 64 +1%%, at 4x and 6x the bytes; every replica sends its factors "
                   "to each other replica of its stage, so many replicas pay the rank many times)")
    g.add_argument("--replica-sync-warmup", type=int, metavar="N",
                   help="powersgd: sum the first N steps exactly, then compress (the start of training is the most "
                   "sensitive to compressed gradients; each exact step sends the whole gradient) (default: 0)")
    g.add_argument("--batch-size", type=int, metavar="N",
                   help="sequences per optimizer step, a multiple of the microbatch (default: the preset's)")
    g.add_argument("--microbatches-in-flight", type=int, metavar="N",
                   help="a head's microbatches between forward and gradient at once: bounds every stage's saved "
                   "activations, so a large --batch-size fits a card (default: 0, all of its share)")
    g.add_argument("--slowest-uplink", metavar="RATE",
                   help="the slowest uplink every peer waits for, a rule of the swarm: a wait for bytes (a reduce's "
                   "contributions, a spot check's inputs, the first step's activations) is its fixed allowance plus "
                   "the bytes' time at this rate (minutes for an exact reduce of a large stage at 8mbit), and a "
                   "replica sending slower than this is cut and the step re-driven without it (default: 8mbit)")
    g.add_argument("--constrained-stage-lr", type=float, metavar="X",
                   help="every stage before the last at X times the lr (any codec); with subspace 0.03 helps from "
                   "d=512 up, hurts at d=256 (docs/fidelity.md 3d-3g, 3j for the others); 1 is the published method "
                   "(default: 0.03 for a subspace preset from d=512 up with 2+ stages, else 1)")


def spec_notes(spec: RunSpec) -> str:
    """The spec's options that are off by default, as the summary line shows them (so that a preset's own,
    such as the stage lr of a subspace run from d=512 up, is not a surprise)."""
    notes = [f"stages before the last at {spec.constrained_stage_lr_scale:g} x the lr"
             if spec.constrained_stage_lr_scale != 1.0 else "",
             f"hybrid: {spec.residual_width} bottleneck numbers a token beside the k exact" if spec.hybrid else "",
             f"{spec.microbatches_in_flight} microbatches in flight a head" if spec.microbatches_in_flight else "",
             f"{spec.replica_sync_warmup} exact sync steps first" if spec.replica_sync_warmup else "",
             f"waits for uplinks down to {spec.slowest_uplink_bps / 1e6:g} Mbit/s"
             if spec.slowest_uplink_bps != SLOWEST_UPLINK_BPS else ""]
    return "".join(f", {n}" for n in notes if n)


def slowest_uplink(text: str | None) -> float | None:
    """--slowest-uplink in bit/s (None: not given), or a ValueError that says what to give."""
    if text is None:
        return None
    try:
        rate = parse_bandwidth(text)
    except ValueError:
        rate = None
    if rate is None:  # unlimited, or not a rate: a reduce must not wait for ever
        raise ValueError(f"--slowest-uplink must be a rate such as 8mbit or 2MB/s, not {text!r}.")
    return rate


# flags that describe a run spec, which `--run-spec FILE` describes instead: given beside it, they are refused
# rather than silently ignored (--slowest-uplink is the exception: it is applied on top of the file)
_SPEC_FLAGS = ("stages", "codec", "rank", "vocab", "residual_width", "wire_dtype", "quant", "basis_interval", "seed",
               "replica_sync", "replica_sync_rank", "replica_sync_warmup", "batch_size", "microbatches_in_flight",
               "constrained_stage_lr")


def _refuse_beside_run_spec(a: argparse.Namespace) -> None:
    given = [f"--{name.replace('_', '-')}" for name in _SPEC_FLAGS if getattr(a, name, None) is not None]
    given += ["--preset"] if getattr(a, "preset", "tiny") != "tiny" else []
    given += ["--dtype"] if getattr(a, "dtype", "auto") != "auto" else []
    if given:
        raise ValueError(f"--run-spec {a.run_spec} sets the whole run spec, so {', '.join(given)} would be ignored; "
                         f"change {'it' if len(given) == 1 else 'them'} in the file, or drop --run-spec.")


def dtype_origin(a: argparse.Namespace) -> str:
    """Where the compute dtype of the spec `spec_from_args(a)` came from, as the banner says it."""
    if getattr(a, "run_spec", None):
        return f"from {a.run_spec}"
    if a.dtype != "auto":
        return "--dtype"
    device = _auto_device(a)
    if device.startswith("cuda"):
        return f"auto: {device}"
    if getattr(a, "device", None) is None and getattr(a, "devices", None) is None:  # a coordinator: its own machine
        return "auto: this machine has no CUDA GPU; a swarm of GPU peers wants --dtype bf16 or fp16"
    return f"auto: {device}"


def _auto_device(a: argparse.Namespace) -> str:
    """The device `--dtype auto` is judged by: the peers' (swarm local), else this machine's own GPU (coordinator)."""
    import torch
    return (getattr(a, "devices", None) or "").split(",")[0].strip() or getattr(a, "device", None) \
        or ("cuda" if torch.cuda.is_available() else "cpu")


def spec_from_args(a: argparse.Namespace) -> RunSpec:
    """The run spec the flags describe: `--run-spec FILE` as it is (ValueError if other spec flags are given
    beside it), else the preset with the flags given."""
    floor = slowest_uplink(a.slowest_uplink)  # a bad rate fails before a spec file is read
    if a.run_spec:
        _refuse_beside_run_spec(a)
        spec = RunSpec.load(a.run_spec)
        return spec if floor is None else spec.replace(slowest_uplink_bps=floor)
    device = _auto_device(a)  # --dtype auto: judged by the peers' device (swarm local), else this machine's GPU
    return preset(a.preset, stages=a.stages, codec=a.codec, rank=a.rank, vocab=a.vocab, residual_width=a.residual_width,
                  wire_dtype=a.wire_dtype, quant=a.quant,
                  basis_interval=a.basis_interval, seed=a.seed, dtype=resolve_dtype(a.dtype, device),
                  replica_sync=a.replica_sync, replica_sync_rank=a.replica_sync_rank,
                  replica_sync_warmup=a.replica_sync_warmup,
                  constrained_stage_lr_scale=a.constrained_stage_lr, batch_size=a.batch_size,
                  microbatches_in_flight=a.microbatches_in_flight, slowest_uplink_bps=floor)

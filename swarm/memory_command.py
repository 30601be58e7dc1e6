"""`swarm memory`: what each stage of a run needs, on any machine, and `swarm local`'s check of it.

The figures are `peer/runner/memory_estimate.py`'s, from the run spec alone (no tensor is
built, no GPU needed): each stage's estimated peak and the smallest common card class it fits
(sizes in GiB, as cards are sold: a "24 GB" card is counted as 24 GiB, and `--max-memory 24GB`
means the same). `swarm local` runs every peer on this machine, so before it starts anything
it checks that the stages it would place on each device fit there together.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from peer.runner.memory_estimate import (
    GIB,
    HEADROOM,
    StageMemory,
    estimate_stage,
    format_bytes,
    smallest_card,
    torch_device_type,
)
from protocol.spec import RunSpec
from swarm.user_errors import Refused

PROCESS_OVERHEAD = GIB // 4  # a peer process's own CPU memory beside its stage (Python, torch, hivemind, p2pd; forked
# from one fork server, so much of it shared): kept low, since refusing a run that fits is worse than a late error


@dataclass(frozen=True)
class DeviceNeed:
    """What `swarm local` would place on one device: its stages' estimates and the budget there."""

    device: str
    stages: list[StageMemory]
    need: int
    have: int | None  # None: unknown (no way to ask the device)


def card_words(peak: int) -> str:
    gb = smallest_card(peak)
    return f"{gb} GB" if gb is not None else "none (more than 80 GB)"


def memory_table(spec: RunSpec, device: str, checkpointing: bool, replicated: bool) -> list[str]:
    """The lines `swarm memory` prints: one per stage, its parts, peak and card class."""
    rows = [estimate_stage(spec, s, device=device, checkpointing=checkpointing, replicated=replicated)
            for s in range(spec.n_stages)]
    head = f"{'stage':>5}  {'params':>9}  {'weights+optim':>13}  {'activations':>11}  {'peak':>9}  card (smallest)"
    lines = [head]
    for m in rows:
        lines.append(f"{m.stage:>5}  {m.params / 1e6:>8.1f}M  {format_bytes(m.weights + m.optimizer):>13}  "
                     f"{format_bytes(m.activations):>11}  {format_bytes(m.peak):>9}  {card_words(m.peak)}")
    return lines


def cmd_memory(a: argparse.Namespace) -> int:
    from swarm.spec_flags import dtype_origin, spec_from_args
    device = a.device
    if a.dtype == "auto" and torch_device_type(device) == "cuda" and not a.run_spec:
        a.dtype = "bf16"  # the estimate is for a card, whatever this machine has
        origin = "auto: bf16 as on a card from Ampere on; --dtype fp16 for an older one"
    else:
        origin = dtype_origin(a)
    spec = spec_from_args(a)
    print(f"swarm memory: {spec.name}, {spec.n_stages} stages, codec {spec.codec}, dtype {spec.dtype} ({origin}), "
          f"on {device}, {spec.max_in_flight} microbatches in flight a stage, activation checkpointing "
          f"{'on' if a.activation_checkpointing else 'off'}{', one replica among several' if a.replicated else ''}")
    for line in memory_table(spec, device, a.activation_checkpointing, a.replicated):
        print(line)
    print(f"card: the smallest common card (8, 12, 16, 24, 48, 80 GB, counted as GiB) that holds the peak x "
          f"{HEADROOM:g} beside 0.5 GiB for the CUDA context; a peer's --max-memory is counted the same way.")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from swarm.spec_flags import add_spec_flags
    me = sub.add_parser("memory", help="each stage's estimated peak memory and the card class it needs",
                        description="Estimate each stage's peak memory from the run spec alone (no GPU needed): "
                        "weights, optimizer moments, activations of the microbatches in flight, and the smallest "
                        "common card class that holds it. Sizes are GiB; a \"24 GB\" card counts as 24 GiB, as "
                        "`--max-memory 24GB` does.")
    add_spec_flags(me)
    me.add_argument("--device", default="cuda", help="where the stages run: cuda (a card; default) or cpu")
    me.add_argument("--activation-checkpointing", action="store_true",
                    help="as a peer started with --activation-checkpointing")
    me.add_argument("--replicated", action="store_true",
                    help="count the flat gradient sum a stage with several replicas holds")
    me.set_defaults(func=cmd_memory)


def _available_ram() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _device_budget(device: str) -> int | None:
    if torch_device_type(device) == "cuda":
        import torch
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return _available_ram() if torch_device_type(device) == "cpu" else None


def local_needs(spec: RunSpec, devices: list[str], replicas: int) -> list[DeviceNeed]:
    """Per device, the stages `swarm local` would start there (peer i on devices[i % len]) and their sum."""
    by_device: dict[str, list[StageMemory]] = {}
    index = 0
    for _ in range(replicas):
        for s in range(spec.n_stages):
            device = devices[index % len(devices)]
            index += 1
            by_device.setdefault(device, []).append(
                estimate_stage(spec, s, device=device, replicated=replicas > 1))
    out = []
    for device, stages in by_device.items():
        need = int(sum(m.peak for m in stages) * HEADROOM)
        if torch_device_type(device) == "cpu":  # every process's own memory, and the coordinator's
            need += PROCESS_OVERHEAD * (len(stages) + 1)
        out.append(DeviceNeed(device, stages, need, _device_budget(device)))
    return out


def check_local_memory(spec: RunSpec, devices: list[str], replicas: int) -> None:
    """Refused (one sentence) when the stages `swarm local` would place on a device do not fit it."""
    if os.environ.get("SWARM_SKIP_MEMORY_CHECK") == "1":  # an escape hatch: the estimate is an estimate
        print("memory check skipped (SWARM_SKIP_MEMORY_CHECK=1)", file=sys.stderr)
        return
    for d in local_needs(spec, devices, replicas):
        if d.have is None or d.need <= d.have:
            continue
        largest = max(d.stages, key=lambda m: m.peak)
        raise Refused(
            f"the {len(d.stages)} peer{'s' if len(d.stages) != 1 else ''} this swarm would start on {d.device} need "
            f"about {format_bytes(d.need)} together (stage {largest.stage} alone about {format_bytes(largest.peak)}), "
            f"but {d.device} has {format_bytes(d.have)} free; pass a smaller --preset, fewer --replicas or more "
            f"devices (--devices), or see what each stage needs with `swarm memory --preset {spec.name} --device "
            f"{torch_device_type(d.device)}` (SWARM_SKIP_MEMORY_CHECK=1 starts anyway).")

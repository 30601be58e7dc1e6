"""Which stages fit this peer's memory, and the one sentence that says so when none does.

A peer's budget is `--max-memory` if given, else the free memory of its CUDA device
(`torch.cuda.mem_get_info`), else (CPU) no cap. A stage fits when its estimated peak
(`peer/runner/memory_estimate.py`, counting the flat gradient sum a replica sync holds, since any
stage may gain replicas) times `HEADROOM` is within the budget. Placement then chooses only
among the stages that fit (`choose_stage(..., allowed=...)`), a remembered stage that does not
fit is forgotten, and the rebalancer never moves the peer to a stage that does not fit.
"""
from __future__ import annotations

import logging

from peer.runner.memory_estimate import StageMemory, estimate_stage, fits, format_bytes, parse_size, smallest_card
from protocol.spec import RunSpec

log = logging.getLogger(__name__)


def memory_budget(max_memory: str | None, device: str) -> int | None:
    """Bytes this peer's stage may take: `--max-memory`, else the CUDA device's free memory, else None (no cap)."""
    if max_memory:
        return parse_size(max_memory)
    if device.startswith("cuda"):
        import torch
        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return None


def stage_needs(spec: RunSpec, device: str, checkpointing: bool) -> list[StageMemory]:
    """Every stage's estimated peak on `device`, as one replica among several."""
    return [estimate_stage(spec, s, device=device, checkpointing=checkpointing, replicated=True)
            for s in range(spec.n_stages)]


def _card(peak: int) -> str:
    gb = smallest_card(peak)
    if gb is None:
        return "more than any common card holds (80 GB)"
    return f"{'an' if gb in (8, 80) else 'a'} {gb} GB card or larger"


def fitting_stages(spec: RunSpec, budget: int | None, device: str = "cuda", checkpointing: bool = False,
                   requested: int | None = None) -> frozenset[int]:
    """The stages this peer may serve within `budget` (all of them without a budget); ValueError with one
    sentence when none fits, or when the `requested` stage does not."""
    if budget is None:
        return frozenset(range(spec.n_stages))
    needs = stage_needs(spec, device, checkpointing)
    ok = frozenset(m.stage for m in needs if fits(m.peak, budget))
    where = "(--max-memory, else the device's free memory)"
    if requested is not None and requested in range(spec.n_stages) and requested not in ok:
        need = needs[requested].peak
        others = f" (stages that fit: {', '.join(map(str, sorted(ok)))})" if ok else ""
        raise ValueError(
            f"stage {requested} of {spec.name} needs about {format_bytes(need)} (estimated peak) but this peer has "
            f"{format_bytes(budget)} {where}, so it needs {_card(need)}: pass "
            f"{'' if checkpointing else '--activation-checkpointing or '}--stage auto{others}, or join from a "
            f"larger card.")
    if not ok:
        least = min(needs, key=lambda m: m.peak)
        raise ValueError(
            f"no stage of {spec.name} fits this peer's {format_bytes(budget)} {where}: the smallest, stage "
            f"{least.stage}, needs about {format_bytes(least.peak)} (estimated peak), which takes "
            f"{_card(least.peak)}; {'' if checkpointing else 'pass --activation-checkpointing or '}join from a "
            f"larger card.")
    if len(ok) < spec.n_stages:
        log.info("stages %s fit this peer's %s; the others do not", sorted(ok), format_bytes(budget))
    return ok

"""How a step's batch is cut into microbatches, and what each one weighs in the step's loss.

By default a step of `batch_size` sequences is `batch_size / microbatch_size` equal microbatches. A spec
may list the sizes instead (`RunSpec.microbatch_sizes`, `--microbatch-sizes 2,14,14,2`): a pipeline fills
with its first microbatch and drains with its last, and over a slow uplink those two cross every boundary
while nothing else is left to compute (docs/benchmarks.md, "Links busy"), so small ends shorten the step
by what they save on the wire, while the middle ones stay large enough to keep a GPU efficient.

The step's loss is the mean over every predicted token of the step, however it is cut:

    L = sum_m (B_m / B) L_m

with L_m the mean loss over microbatch m's tokens, B_m its sequences and B = batch_size (every sequence
has seq_len predicted tokens). Equal microbatches weigh 1 / n each, computed as L_m / n, bit for bit what
the swarm computed before sizes could be listed. The weight comes from the spec by the microbatch's
index, never from the tensor a sender chose to send, and a stage refuses a microbatch whose rows are not
its size (`check_rows`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .spec import RunSpec

MAX_MICROBATCHES = 4096  # a listed cut longer than this is a typo, not a schedule


def parse_sizes(text: str) -> tuple[int, ...]:
    """`--microbatch-sizes 2,14,14,2` as a tuple, or a ValueError that says what to give."""
    try:
        sizes = tuple(int(x) for x in text.replace(" ", "").split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 for s in sizes) or len(sizes) > MAX_MICROBATCHES:
        raise ValueError(f"--microbatch-sizes takes sequences per microbatch, comma-separated, each at least 1, "
                         f"such as 2,14,14,2; not {text!r}.")
    return sizes


def size_problem(sizes: Sequence[int], batch_size: int, microbatch_size: int) -> str | None:
    """Why a listed cut does not fit the spec (one sentence), or None."""
    if not sizes:
        return None
    if len(sizes) > MAX_MICROBATCHES or any(s < 1 for s in sizes):
        return f"microbatch_sizes must list 1 to {MAX_MICROBATCHES} sizes of at least 1 sequence each."
    if sum(sizes) != batch_size:
        return f"microbatch_sizes must add up to batch_size ({batch_size}), not {sum(sizes)}."
    if max(sizes) != microbatch_size:
        return (f"microbatch_size must be the largest of microbatch_sizes ({max(sizes)}), not {microbatch_size}: "
                "it bounds every message and every stage's memory.")
    return None


def count(spec: RunSpec) -> int:
    """n: the microbatches of a step."""
    return len(spec.microbatch_sizes) if spec.microbatch_sizes else spec.batch_size // spec.microbatch_size


def rows(spec: RunSpec, index: int) -> int:
    """B_m: the sequences of microbatch `index`."""
    return spec.microbatch_sizes[index] if spec.microbatch_sizes else spec.microbatch_size


def weigh(spec: RunSpec, loss: torch.Tensor, index: int) -> torch.Tensor:
    """(B_m / B) L_m, the part of the step's loss that microbatch `index`'s backward starts from."""
    if not spec.microbatch_sizes:
        return loss / count(spec)
    return loss * (rows(spec, index) / spec.batch_size)


def step_loss(spec: RunSpec, losses: Sequence[float]) -> float:
    """The step's loss from its microbatches' losses, in index order: sum_m (B_m / B) L_m."""
    if not spec.microbatch_sizes:
        return sum(losses) / len(losses)
    return sum(loss * b for loss, b in zip(losses, spec.microbatch_sizes)) / spec.batch_size


def check_rows(spec: RunSpec, index: int, got: int) -> str | None:
    """Why `got` sequences are not microbatch `index` (one sentence), or None."""
    want = rows(spec, index)
    return None if got == want else f"microbatch {index} holds {want} sequences, not {got}."

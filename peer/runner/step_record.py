"""`StepRecord`: what a runner's optimizer step reports (its own file so that the runner's halves,
`reduced.py` among them, name it without importing `stage.py`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepRecord:
    step: int
    grad_norm: float  # of the unscaled gradient; nan for a skipped step
    lr: float
    skipped: bool = False  # fp16 overflow somewhere in the swarm: no optimizer step (loss_scaling.py)

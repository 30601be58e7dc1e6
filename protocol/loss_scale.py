"""`LossScale`: the dynamic loss scale of an fp16 run, one value that every stage and replica agrees on.

fp16 keeps 5 exponent bits: gradients below ~6e-8 flush to zero and values above 65504 become
inf. So in an fp16 run the last stage backpropagates S * loss instead of the loss, with S a
power of two: every gradient of the step, each stage's weight gradients and every boundary
gradient that crosses a stage boundary, is S times the true one (exactly: scaling by a power of
two commutes with rounding). A stage divides its reduced gradient by S before clipping and the
optimizer (exact again), and divides a received boundary gradient by S before it judges its size.

The scale changes only at a step's commit, from one verdict that every stage and replica gets
from the leading head (peer/step/driver.py): a step in which any stage saw an inf or NaN (in its
reduced gradient, or in a boundary gradient it computed or received) is skipped everywhere and
S halves; after `interval` applied steps in a row S doubles. So the scale is a function of the
verdicts alone, the same on every replica, and it is part of a stage's state (checkpoints,
snapshots, state transfer), so a joining replica agrees too. The constants are torch's
GradScaler defaults (initial 2^16, growth 2, backoff 1/2, interval 2000), plus a floor of 2^-16
so that a run that overflows step after step (a diverged one, or a hostile peer that flags
overflows, docs/security.md) keeps a positive power of two rather than reaching zero.
"""
from __future__ import annotations

from dataclasses import dataclass

from protocol.spec import RunSpec

INITIAL_SCALE = 2.0 ** 16
GROWTH_INTERVAL = 2000
MIN_SCALE = 2.0 ** -16
MAX_SCALE = 2.0 ** 64


@dataclass
class LossScale:
    """S and the count of applied steps since S last changed."""

    scale: float = INITIAL_SCALE
    good_steps: int = 0
    interval: int = GROWTH_INTERVAL

    def update(self, overflow: bool) -> None:
        """After a step's verdict: overflow -> S / 2 (the step was skipped); else one more good step,
        and S * 2 once `interval` of them came in a row."""
        if overflow:
            self.scale = max(self.scale / 2.0, MIN_SCALE)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.interval:
            self.scale = min(self.scale * 2.0, MAX_SCALE)
            self.good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])


def uses_loss_scale(spec: RunSpec) -> bool:
    """Whether a run's stages scale the loss: fp16 compute only (bf16, fp32 and fp64 have fp32's range)."""
    return spec.dtype == "fp16"


def loss_scale_for(spec: RunSpec) -> LossScale | None:
    return LossScale() if uses_loss_scale(spec) else None

"""The loss-scaling half of a `StageRunner` (fp16 runs; protocol/loss_scale.py has the rule).

In an fp16 run the last stage backpropagates S * loss (`StageRunner.forward_backward`), so each
stage's accumulated gradients and every boundary gradient are S times the true ones. Here:

- `boundary_gradient`: what a stage sends upstream for a microbatch. A boundary gradient holding
  an inf or NaN cannot travel (the wire refuses non-finite payloads, and a peer that sends them
  is banned): zeros go instead with the message's overflow flag set, and a flag received with a
  gradient travels on upstream the same way. The step is skipped anyway.
- `overflowed`: this stage's verdict at the commit: a flagged microbatch, or an inf or NaN in
  the gradient it would apply (the reduced sum, or its own accumulated gradients when alone).
- `share`: a replica's contribution to its stage's reduce, or, when its share overflowed, its
  microbatches and no numbers (`local_overflow`).
- `unscale`: the gradients divided by S before clipping and the optimizer (exact: S = 2^n).

Runs without a loss scale (fp32, fp64, bf16) have S = 1 and never flag anything.
"""
from __future__ import annotations

import torch


class ScaledGradients:
    """Mixed into `StageRunner` (peer/runner/stage.py), whose loss scale, gradients and reduced sum these use."""

    @property
    def scale(self) -> float:
        """S of the step in progress (1.0 without loss scaling)."""
        return self.loss_scale.scale if self.loss_scale is not None else 1.0

    def boundary_gradient(self, microbatch: int, grad: torch.Tensor | None) -> tuple[torch.Tensor | None, bool]:
        """(what to send upstream, overflow flag) for a microbatch's dL/dz_in (None on stage 0)."""
        if grad is None or self.loss_scale is None:
            return grad, False
        if microbatch not in self.overflow_mbs and bool(torch.isfinite(grad).all()):
            return grad, False
        self.overflow_mbs.add(microbatch)
        return torch.zeros_like(grad), True

    def overflowed(self) -> bool:
        """This stage's verdict at the commit: a flagged microbatch, a replica that said it
        overflowed, or an inf or NaN in the gradient it would apply (the reduced sum, or its own
        accumulated gradients when it is alone)."""
        if self.loss_scale is None:
            return False
        r = self.reduced
        if r is not None and (r.overflow or self.overflow_mbs):
            return True
        if r is not None and r.grads is not None:
            return not bool(torch.isfinite(r.grads).all())
        return self.local_overflow()

    def local_overflow(self) -> bool:
        """Whether this replica's own share of the step overflowed (a flagged microbatch, or an
        inf or NaN in its accumulated gradients): its contribution then says so instead of
        carrying non-finite numbers, which the wire refuses."""
        if self.loss_scale is None:
            return False
        if self.overflow_mbs:
            return True
        grads = [p.grad for p in self.params if p.grad is not None]
        return bool(grads) and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())

    def share(self, on_device: bool) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None, bool]:
        """(microbatches, flat gradient, statistic, overflow): `contribution`, or no numbers at all
        when this replica's share overflowed (non-finite numbers do not travel)."""
        if self.local_overflow():
            return self.microbatches_done(), None, None, True
        return (*self.contribution(on_device), False)

    def unscale(self) -> None:
        """Divide the gradients about to be applied by S."""
        if self.loss_scale is None or self.loss_scale.scale == 1.0:
            return
        inv = 1.0 / self.loss_scale.scale  # a power of two: multiplying by it is exact
        for p in self.params:
            if p.grad is not None:
                p.grad.mul_(inv)

"""The replica half of a `StageRunner`: a stage's gradients as one flat tensor, and the agreed
sum of an all-reduce waiting to be applied.

Replicas of a stage agree on a step's gradient sum (`peer/commit/commit.py`): each hands its share
(`contribution`), keeps the agreed sum (`set_reduced`) and steps with it when told
(`apply_reduced`), or takes a step computed elsewhere (`apply_flat`, a replica catching up).
A flat gradient travels in the `SyncLayout` (constrained gradients in subspace coordinates)
or, for a lone replica's followers, as every parameter's gradient in full.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .stage_error import StageError
from .step_record import StepRecord

if TYPE_CHECKING:
    from protocol.control import Contribution



@dataclass
class Reduced:
    """The agreed gradient sum of one attempt at a step, waiting to be applied."""

    step: int
    attempt: int
    grads: torch.Tensor | None  # flat, in `StageRunner.params` order; None: the accumulated gradients are the sum
    stat: torch.Tensor | None
    contributors: dict[str, list[int]]
    in_layout: bool = True  # grads in the `SyncLayout`; False: every parameter's gradient in full (a lone replica's)
    overflow: bool = False  # fp16: a replica's share overflowed (grads then hold no numbers to apply)
    # powersgd: the (exact, P, Q') sums `grads` was rebuilt from, on the CPU: what a follower is sent instead
    factors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


class ReducedGradients:
    """Mixed into `StageRunner` (peer/runner/stage.py), whose parameters, layout and step these use."""

    def microbatches_done(self) -> list[int]:
        return sorted(self._backward_done)

    def contribution(self, on_device: bool = False,
                     in_layout: bool = True) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None]:
        """(microbatches, flat gradient sum, statistic) of this replica's share of the step;
        tensors are None when it computed nothing (it adds nothing to the sum). The flat sum is
        in the `SyncLayout` (to travel), or every parameter's gradient in full (`in_layout`
        False: a lone replica's, which travels nowhere but to followers); on the CPU unless
        `on_device`."""
        mbs = self.microbatches_done()
        if not mbs:
            return [], None, None
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = self.layout.pack(grads, self.current_U()) if in_layout else \
            torch.cat([g.detach().reshape(-1) for g in grads])
        collected = self._step_stat is not None and self.spec.in_stat_window(self.step)
        return mbs, (flat if on_device else flat.cpu()), (self._step_stat.detach().cpu() if collected else None)

    def current_U(self) -> torch.Tensor | None:
        return self.basis.U if self.basis is not None else None

    def set_reduced(self, reduced: Reduced) -> None:
        if reduced.step != self.step:
            raise StageError(f"a reduced gradient for step {reduced.step} reached a stage on step {self.step}.")
        self.reduced = reduced

    def apply_reduced(self, step: int, attempt: int, skip: bool = False) -> StepRecord:
        """Take the optimizer step with the agreed gradient sum of (step, attempt), or skip it
        (`skip`: the swarm's verdict that some stage overflowed in fp16)."""
        r = self.reduced
        if r is None or (r.step, r.attempt) != (step, attempt):
            raise StageError(f"no reduced gradient is held for attempt {attempt} of step {step}.")
        if r.overflow and not skip:
            raise StageError(f"step {step} overflowed on this stage; it can only be skipped.")
        if r.grads is not None and not skip:  # None: the accumulated gradients are the sum (a lone replica's)
            self.load_flat_grads(r.grads, r.stat, r.in_layout)
        return self._step(skip)

    def apply_flat(self, step: int, flat: torch.Tensor | None, stat: torch.Tensor | None,
                   in_layout: bool = True, skip: bool = False) -> StepRecord:
        """Take step `step` with a reduced gradient computed elsewhere (a replica catching up), or
        skip it as the swarm did (`skip`; `flat` may then be None)."""
        if step != self.step:
            raise StageError(f"a reduced gradient for step {step} reached a stage on step {self.step}.")
        self.abort_step()  # whatever this replica computed of the step, the agreed sum replaces it
        if not skip:
            self.load_flat_grads(flat, stat, in_layout)
        return self._step(skip)

    def load_flat_grads(self, flat: torch.Tensor, stat: torch.Tensor | None, in_layout: bool = True) -> None:
        """Put a flat gradient (and the step's statistic) in place of whatever was accumulated:
        in the `SyncLayout` (constrained gradients are rebuilt in span(U) of the step's basis),
        or, with `in_layout` False, every parameter's gradient in full."""
        self._pending.clear()
        flat = flat.to(self.device)
        if in_layout:
            grads = self.layout.unpack(flat.to(self.dtype), self.current_U())
        else:
            if flat.numel() != self.n_params:
                raise StageError(f"a full flat gradient of {flat.numel()} numbers does not fit {self.n_params}.")
            offsets = [0]
            for p in self.params:
                offsets.append(offsets[-1] + p.numel())
            grads = [flat[a:b].view_as(p) for p, a, b in zip(self.params, offsets, offsets[1:])]
        for p, g in zip(self.params, grads):
            p.grad = g.to(p.dtype).clone()
        # a sum the stage's other replicas (or a follower) apply too: applied by portable operations. Rebuilt
        # from the layout, the constrained gradients are U C (in span(U)): taken as they are, not projected again
        self.grads_shared, self.grads_in_span = True, in_layout
        if self._step_stat is not None:
            self._step_stat.copy_(stat.to(self._step_stat) if stat is not None else torch.zeros_like(self._step_stat))


def sum_factors(contributions: dict[str, Contribution], dtype: torch.dtype) -> torch.Tensor:
    """The contributions' factors added up in ascending peer-id order, in the compute dtype."""
    total: torch.Tensor | None = None
    for peer in sorted(contributions):
        if contributions[peer].factors is None:
            continue  # a replica with nothing to add
        f = contributions[peer].factors.to(dtype)
        total = f.clone() if total is None else total.add_(f)
    if total is None:
        raise StageError("no replica contributed factors to the reduce.")
    return total


def sum_contributions(step: int, attempt: int, contributions: dict[str, Contribution], n_microbatches: int,
         in_layout: bool = True) -> Reduced:
    """Add contributions in ascending peer-id order (the same bits on every replica); every
    microbatch of the step exactly once. A contribution flagged overflow (fp16) adds nothing and
    marks the sum: the step will be skipped."""
    seen: dict[int, str] = {}
    total: torch.Tensor | None = None
    stat: torch.Tensor | None = None
    overflow = any(c.overflow for c in contributions.values())
    for peer in sorted(contributions):
        c = contributions[peer]
        for mb in c.microbatches:
            if mb in seen:
                raise StageError(f"microbatch {mb} was computed by two replicas ({seen[mb][-8:]}, {peer[-8:]}).")
            seen[mb] = peer
        if c.grads is not None:
            total = c.grads.clone() if total is None else total.add_(c.grads)
        if c.stat is not None:
            stat = c.stat.clone() if stat is None else stat.add_(c.stat)
    missing = sorted(set(range(n_microbatches)) - set(seen))
    if missing:
        raise StageError(f"microbatches {missing} of the step are in no replica's contribution.")
    assert total is not None or overflow  # every microbatch is somewhere, so some contribution carries tensors
    return Reduced(step, attempt, None if overflow else total, None if overflow else stat,
                   {p: c.microbatches for p, c in contributions.items()}, in_layout, overflow)

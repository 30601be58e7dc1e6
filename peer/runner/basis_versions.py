"""`BasisVersions`: the part of a `StageRunner` (peer/runner/stage.py) that keeps its subspace basis's versions: the
re-fit statistic it hands the coordinator, a re-fit scheduled to take effect at a later step, the switch itself
(weights and first moments mapped into the new span), and which version each step used.

A mixin: it reads and writes the runner's own fields (`basis`, `_scheduled`, `version_history`, `step`, the
optimizer and the module), set up in `StageRunner.__init__`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from protocol.basis_update import canonical_basis
from protocol.subspace import SubspaceBasis

from .stage_error import StageError

if TYPE_CHECKING:
    from protocol.model import StageModule
    from protocol.spec import RunSpec


class BasisVersions:
    spec: RunSpec
    module: StageModule
    basis: SubspaceBasis | None
    step: int
    stat: torch.Tensor | None
    _scheduled: tuple[SubspaceBasis, int] | None
    version_history: list[tuple[int, int]]

    def refit_due(self) -> bool:
        """True right after the optimizer step that ends a basis interval (a receiving stage sends its stat)."""
        return self.stat is not None and self.step > 0 and self.step % self.spec.basis_interval == 0

    def refit_statistic(self) -> torch.Tensor:
        assert self.stat is not None, "only receiving stages of a subspace run keep the statistic"
        return self.stat.to("cpu", torch.float32)

    def _work_started(self) -> bool:
        return bool(self._pending or self._backward_done)

    def can_schedule(self, version: int, effective_step: int) -> str | None:
        """None if a basis of `version` may take effect at `effective_step`, else why not."""
        if self.basis is None:
            return "this run does not use the subspace codec."
        if effective_step < self.step or (effective_step == self.step and self._work_started()):
            return f"basis version {version} was due at step {effective_step}, which has already started here."
        if self._scheduled is not None and self._scheduled[0].version == version:
            return f"basis version {version} is already scheduled for step {self._scheduled[1]}."
        if version != self.basis.version + 1:
            return f"basis version {version} is not the next one (this stage is on version {self.basis.version})."
        return None

    def schedule_basis(self, U: torch.Tensor, version: int, effective_step: int) -> None:
        problem = self.can_schedule(version, effective_step)
        if problem:
            raise StageError(problem)
        U = canonical_basis(U, self.dtype).to(self.device)
        self._scheduled = (SubspaceBasis(U, self.basis.T_fixed, version), effective_step)
        self._maybe_switch()

    @property
    def scheduled(self) -> tuple[int, int] | None:
        """(version, effective step) of the basis waiting to take effect, if any."""
        return (self._scheduled[0].version, self._scheduled[1]) if self._scheduled else None

    def version_for_step(self, step: int) -> int:
        """The basis version this stage uses for `step` (past, current or scheduled)."""
        if self._scheduled is not None and step >= self._scheduled[1]:
            return self._scheduled[0].version
        return next(v for start, v in reversed(self.version_history) if start <= step)

    def _maybe_switch(self) -> None:
        if self._scheduled is None or self.step < self._scheduled[1] or self._work_started():
            return
        basis, _ = self._scheduled
        self.last_truncation = self.switch_basis(basis)
        self._scheduled = None  # last: until here version_for_step() already answers the new version

    def catch_up_basis(self, U: torch.Tensor, version: int, effective_step: int) -> float:
        """Start-up only: apply an update whose step passed while this peer was away."""
        if self.basis is None or version != self.basis_version + 1 or effective_step > self.step:
            raise StageError(f"basis version {version} cannot be caught up at step {self.step}.")
        U = canonical_basis(U, self.dtype).to(self.device)
        return self.switch_basis(SubspaceBasis(U, self.basis.T_fixed, version), first_step=effective_step)

    def switch_basis(self, basis: SubspaceBasis, first_step: int | None = None) -> float:
        """Map weights and first moments into the new subspace, used from `first_step` (default:
        the current step) on; returns the truncated energy ||(I - P_new) W|| / ||W|| over the
        constrained weights (the function change at the switch)."""
        before = [w.detach().clone() for _, w, _ in self.module.constrained_weights()]
        basis = basis.to(self.device, self.dtype)
        self.module.switch_basis(basis)
        self.optimizer.set_basis(basis.U)
        self.basis = basis
        self.basis_updated_step = self.step if first_step is None else first_step
        self.version_history.append((self.basis_updated_step, basis.version))
        after = [w.detach() for _, w, _ in self.module.constrained_weights()]
        num = sum(float((a - b).pow(2).sum()) for a, b in zip(after, before))
        den = sum(float(b.pow(2).sum()) for b in before)
        return (num / den) ** 0.5 if den else 0.0

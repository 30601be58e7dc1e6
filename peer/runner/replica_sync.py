"""`PowerSync`: one replica's side of replica_sync "powersgd" (docs/algorithms.md 5.2).

`StepCommit` runs the exchange; this room holds what the math needs between its rounds and
across steps: the plan (which gradients travel as factors), the state (Q, shared by the
replicas; the error feedback, this replica's own) and the state a reduce computed, which
becomes the state only when its step is applied: an attempt that is aborted after its reduce
leaves no trace, and its microbatches are re-driven against the state it started from.

Also `flat_limits`, what a replica of a stage accepts in a reduce, for both modes (and for the
exact steps of powersgd's warm-up, `RunSpec.replica_sync_warmup`: during them `StepCommit` sums
exactly and this state waits untouched, so the first compressed step starts from the seeded Q).
"""
from __future__ import annotations

import torch

from protocol.flat_limits import FlatLimits
from protocol.portable_linalg import portable_matmul
from protocol.powersgd import (
    FirstRound,
    PowerPlan,
    PowerState,
    cat_factors,
    finish,
    first_round,
    on_device,
    orthonormal_factors,
    rebuild,
    second_round,
)
from protocol.spec import WIRE_DTYPES, RunSpec

from .stage import StageRunner


def flat_limits(spec: RunSpec, runner: StageRunner) -> FlatLimits:
    stat = (spec.d_model, spec.rank) if runner.stat is not None else None
    phases, factor_dtype = (), None
    if spec.replica_sync == "powersgd":
        plan = PowerPlan.for_layout(runner.layout, spec.replica_sync_rank)
        phases, factor_dtype = ((plan.exact_numel, plan.p_numel), (0, plan.q_numel)), WIRE_DTYPES[spec.wire_dtype]
    return FlatLimits(spec.run_hash, runner.stage, runner.layout.numel, runner.dtype, stat, spec.n_microbatches,
                      phases, factor_dtype, runner.n_params, spec.replica_sync_warmup if phases else 0,
                      (spec.basis_interval, spec.stat_window))


class PowerSync:
    def __init__(self, runner: StageRunner) -> None:
        spec = runner.spec
        self.runner, self.layout = runner, runner.layout
        self.plan = PowerPlan.for_layout(self.layout, spec.replica_sync_rank)
        self.factor_dtype = WIRE_DTYPES[spec.wire_dtype]
        # the same seed on every replica of the stage: their first Q agree
        self.state = PowerState.initial(self.layout, self.plan, spec.seed * 7919 + 17 + runner.stage, runner.dtype,
                                        runner.device)
        self._basis = self._basis_now()
        self._pending: dict[tuple[int, int], PowerState] = {}

    def _basis_now(self) -> tuple[int, torch.Tensor | None]:
        b = self.runner.basis
        return (b.version, b.U.clone()) if b is not None else (0, None)

    # ---------------------------------------------------------------- the rounds (worker thread)
    def first(self, flat: torch.Tensor | None) -> FirstRound:
        """Round 1 from this replica's flat gradient in the layout, on the device (None: it computed nothing)."""
        version, U = self.runner.basis_version, self.runner.current_U()
        if U is not None and version != self._basis[0]:
            # the error and Q of the last steps were in the old basis's coordinates
            self.state.change_basis(self.layout, self.plan, portable_matmul(U.T, self._basis[1].to(U)))
            self._basis = self._basis_now()
        zero = flat is None  # no microbatch, no factors: its error feedback waits for a step it works in
        if flat is None:
            flat = torch.zeros(self.layout.numel, dtype=self.runner.dtype, device=self.runner.device)
        first = first_round(self.layout, self.plan, self.state, flat, self.factor_dtype)
        first.zero = zero
        return first

    def second(self, first: FirstRound, P_sum: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor],
                                                                      torch.Tensor]:
        """(P^, this replica's Q factors, the same flat as they travel) from the summed P."""
        P_hat = orthonormal_factors(self.layout, self.plan, P_sum, self.runner.dtype)
        if first.M:  # to the device in one copy, once: round 2 and the finish both use it there
            P_hat = on_device(P_hat, first.M[0].device)
        Q_mine = second_round(first.M, P_hat, self.factor_dtype)
        return P_hat, Q_mine, cat_factors(Q_mine, self.factor_dtype)

    def finish(self, key: tuple[int, int], first: FirstRound, exact_sum: torch.Tensor, P_hat: list[torch.Tensor],
               Q_mine: list[torch.Tensor], Q_sum: torch.Tensor) -> torch.Tensor:
        """The agreed gradient (flat, layout, on the device); the new state waits for the step to be applied."""
        flat, state = finish(self.layout, self.plan, first, exact_sum, P_hat, Q_mine, Q_sum, self.runner.dtype)
        if first.zero:  # it sent nothing: all it holds back (M = its error) stays its error
            state = PowerState(state.Q, [m.clone() for m in first.M])
        self._keep(key, state)
        return flat

    def rebuilt(self, exact_sum: torch.Tensor, P_sum: torch.Tensor, Q_sum: torch.Tensor) -> torch.Tensor:
        """A step forwarded in factors (a replica catching up, peer/commit/follow_forward.py): the agreed gradient
        rebuilt from the sums the stage's replicas held, by the operations each of them ran. This replica's
        own state (its seeded Q, its zero error) is left as it is: it took no part in the reduce."""
        P_hat = orthonormal_factors(self.layout, self.plan, P_sum, self.runner.dtype)
        return rebuild(self.layout, self.plan, exact_sum, P_hat, Q_sum, self.runner.dtype, self.runner.device)[0]

    def solo(self, key: tuple[int, int], first: FirstRound) -> torch.Tensor:
        """No other replica took part: the sum is this replica's own (error included), sent nowhere, exact."""
        flat = torch.empty(self.layout.numel, dtype=self.runner.dtype, device=self.runner.device)
        views, off = self.layout.views(flat), 0
        for i in self.plan.exact:
            n = self.layout.entries[i].numel
            views[i].copy_(first.exact[off:off + n].view(self.layout.entries[i].shape))
            off += n
        for j, i in enumerate(self.plan.compressed):
            views[i].copy_(first.M[j])
        self._keep(key, PowerState(self.state.Q, [torch.zeros_like(e) for e in self.state.error]))
        return flat

    def quiet(self) -> bool:
        """No error feedback is waiting to be sent (this replica has been alone, or never computed)."""
        return not any(bool(e.any()) for e in self.state.error)

    def _keep(self, key: tuple[int, int], state: PowerState) -> None:
        self._pending = {k: v for k, v in self._pending.items() if k[0] == key[0]}  # only this step's attempts
        self._pending[key] = state

    def discard(self) -> None:
        """The step was skipped (fp16 overflow): no reduce's state becomes this replica's."""
        self._pending.clear()

    def commit(self, step: int, attempt: int) -> None:
        """The step (step, attempt) was applied here: its reduce's state becomes this replica's."""
        state = self._pending.pop((step, attempt), None)
        if state is not None:
            self.state = state
        self._pending.clear()

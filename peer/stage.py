"""`StageRunner`: one pipeline stage's training state, with no networking in it.

It runs forward on microbatches (keeping what backward needs, keyed by (step, microbatch)),
backward from a received boundary gradient, accumulates gradients, and steps the optimizer
once all of a step's microbatches have been through backward. Steps never mix: work for
any step other than the one in progress is refused with `StageError`. The caller (the
in-process pipeline, or the asyncio daemon on a worker thread) serializes calls.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from protocol.model import StageModule, build_stage, compute_dtype, lm_loss
from protocol.optim import clip_grad_norm, lr_at, make_optimizer, set_lr
from protocol.spec import RunSpec
from protocol.subspace import SubspaceBasis, project_cols, project_rows


class StageError(ValueError):
    """Work this stage must refuse (wrong step, unknown or duplicate microbatch)."""


@dataclass
class _Pending:
    z_in: torch.Tensor | None  # the received boundary tensor (leaf, requires grad) or None on stage 0
    out: torch.Tensor  # this stage's boundary output (graph kept for backward)
    created: float = field(default_factory=time.monotonic)


@dataclass
class StepRecord:
    step: int
    grad_norm: float
    lr: float


class StageRunner:
    def __init__(self, spec: RunSpec, stage: int, device: str | torch.device = "cpu",
                 basis: SubspaceBasis | None = None) -> None:
        self.spec, self.stage, self.device = spec, stage, torch.device(device)
        self.dtype = compute_dtype(spec)
        self.module: StageModule = build_stage(spec, stage, basis).to(self.device)
        self.optimizer = make_optimizer(spec, self.module)
        self.step = 0  # the step whose gradients are being accumulated
        self._pending: dict[int, _Pending] = {}
        self._backward_done: set[int] = set()
        self._constrained = {id(p): k for _, p, k in self.module.constrained_parameters()}

    @property
    def is_first(self) -> bool:
        return self.module.is_first

    @property
    def is_last(self) -> bool:
        return self.module.is_last

    @property
    def basis_version(self) -> int:
        return self.module.basis_version

    def _check_step(self, step: int, microbatch: int) -> None:
        if step != self.step:
            raise StageError(f"stage {self.stage} is on step {self.step}, not {step}.")
        if not 0 <= microbatch < self.spec.n_microbatches:
            raise StageError(f"microbatch {microbatch} is outside 0..{self.spec.n_microbatches - 1}.")
        if microbatch in self._pending or microbatch in self._backward_done:
            raise StageError(f"microbatch {microbatch} of step {step} was already received.")

    def _input(self, z_in: torch.Tensor | None) -> torch.Tensor | None:
        if z_in is None:
            if not self.is_first:
                raise StageError(f"stage {self.stage} needs a boundary tensor.")
            return None
        return z_in.to(self.device, self.dtype).detach().requires_grad_(True)

    def forward(self, step: int, microbatch: int, tokens: torch.Tensor,
                z_in: torch.Tensor | None = None) -> torch.Tensor:
        """Non-last stage: returns the boundary tensor to send (detached); keeps the graph."""
        if self.is_last:
            raise StageError("the last stage runs forward_backward, not forward.")
        self._check_step(step, microbatch)
        tokens = tokens.to(self.device)
        z = self._input(z_in)
        out = self.module(tokens[:, :-1], z)
        self._pending[microbatch] = _Pending(z, out)
        return out.detach()

    def forward_backward(self, step: int, microbatch: int, tokens: torch.Tensor,
                         z_in: torch.Tensor | None) -> tuple[float, torch.Tensor | None]:
        """Last stage: loss on the shifted tokens, backward; returns (loss, dL/dz_in)."""
        if not self.is_last:
            raise StageError("only the last stage computes the loss.")
        self._check_step(step, microbatch)
        tokens = tokens.to(self.device)
        z = self._input(z_in)
        logits = self.module(tokens[:, :-1], z)
        loss = lm_loss(logits, tokens[:, 1:])
        (loss / self.spec.n_microbatches).backward()
        self._backward_done.add(microbatch)
        return float(loss.detach()), (z.grad.detach() if z is not None else None)

    def backward(self, step: int, microbatch: int, grad_out: torch.Tensor) -> torch.Tensor | None:
        """Non-last stage: backprop the received dL/dz_out; returns dL/dz_in (None on stage 0)."""
        if step != self.step:
            raise StageError(f"stage {self.stage} is on step {self.step}, not {step}.")
        pending = self._pending.get(microbatch)
        if pending is None:
            raise StageError(f"no forward pass is waiting for microbatch {microbatch} of step {step}.")
        grad_out = grad_out.to(self.device, self.dtype)
        if grad_out.shape != pending.out.shape:
            raise StageError(f"gradient shape {list(grad_out.shape)} does not match the activation "
                             f"{list(pending.out.shape)}.")
        del self._pending[microbatch]
        pending.out.backward(grad_out)
        self._backward_done.add(microbatch)
        return pending.z_in.grad.detach() if pending.z_in is not None else None

    def pending_shape(self, microbatch: int) -> tuple[int, ...] | None:
        """Shape of the boundary output waiting for its gradient, or None if none waits."""
        p = self._pending.get(microbatch)
        return tuple(p.out.shape) if p is not None else None

    def step_ready(self) -> bool:
        return len(self._backward_done) == self.spec.n_microbatches

    def _projected(self, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        kind = self._constrained.get(id(p))
        U = self.optimizer.U
        if kind == "col":
            return project_cols(g, U)
        if kind == "row":
            return project_rows(g, U)
        return g

    def optimizer_step(self) -> StepRecord:
        """Clip, step and zero the gradients; the stage moves on to the next step."""
        if not self.step_ready():
            raise StageError(f"step {self.step} has {len(self._backward_done)} of "
                             f"{self.spec.n_microbatches} microbatches through backward.")
        params = [p for p in self.module.parameters() if p.requires_grad]
        norm = clip_grad_norm(params, self.spec.grad_clip, self._projected)
        lr = lr_at(self.spec, self.step)
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        record = StepRecord(self.step, norm, lr)
        self.step += 1
        self._backward_done.clear()
        return record

    def drop_stale(self, max_age_s: float) -> int:
        """Forget forward passes whose gradient never came (the peer downstream died)."""
        now = time.monotonic()
        stale = [m for m, p in self._pending.items() if now - p.created > max_age_s]
        for m in stale:
            del self._pending[m]
        return len(stale)

    def abort_step(self) -> None:
        """Throw away this step's partial work (pending graphs and accumulated gradients)."""
        self._pending.clear()
        self._backward_done.clear()
        self.optimizer.zero_grad(set_to_none=True)

    def switch_basis(self, basis: SubspaceBasis) -> float:
        """Map weights and first moments into the new subspace; returns the truncated energy
        ||(I - P_new) W|| / ||W|| over the constrained weights (the function change at the switch)."""
        before = [w.detach().clone() for _, w, _ in self.module.constrained_weights()]
        basis = basis.to(self.device, self.dtype)
        self.module.switch_basis(basis)
        self.optimizer.set_basis(basis.U)
        after = [w.detach() for _, w, _ in self.module.constrained_weights()]
        num = sum(float((a - b).pow(2).sum()) for a, b in zip(after, before))
        den = sum(float(b.pow(2).sum()) for b in before)
        return (num / den) ** 0.5 if den else 0.0

    def state_dict(self) -> dict:
        return {"spec": self.spec.to_json(), "stage": self.stage, "step": self.step,
                "basis_version": self.basis_version, "module": self.module.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("spec") != self.spec.to_json() or state.get("stage") != self.stage:
            raise StageError("checkpoint belongs to another run or stage; start without --resume.")
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.abort_step()

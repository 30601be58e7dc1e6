"""`StageRunner`: one pipeline stage's training state, with no networking in it.

It runs forward on microbatches (keeping what backward needs, keyed by (step, microbatch)),
backward from a received boundary gradient, and accumulates gradients. A step ends in one of
two ways: alone (the in-process pipeline) it steps the optimizer once all of the step's
microbatches have been through backward (`optimizer_step`); as one replica among several it
hands its gradient sum to the all-reduce (`contribution`), keeps the agreed sum
(`set_reduced`) and steps with it when told (`apply_reduced`): with the same sum and the same
state every replica takes the same step. Steps never mix: work for any step other than the
one in progress is refused with `StageError`. The caller (the in-process pipeline, or the
asyncio daemon on a worker thread) serializes calls. The replica half (flat gradients, the
agreed sum) is in `peer/runner/reduced.py`; an fp16 run's loss scale and overflow checks in
`peer/runner/loss_scaling.py`; the subspace basis's versions (scheduled re-fits, switches) in
`peer/runner/basis_versions.py`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from protocol.loss_scale import loss_scale_for
from protocol.model import StageModule, build_stage, compute_dtype, lm_loss, spec_basis
from protocol.optim import clip_grad_norm, lr_at, make_optimizer, set_lr, stage_lr_ratio
from protocol.spec import RunSpec
from protocol.subspace import SubspaceBasis, portable_project_cols, portable_project_rows, project_cols, project_rows
from protocol.sync_layout import SyncLayout

from .basis_versions import BasisVersions
from .loss_scaling import ScaledGradients
from .reduced import Reduced, ReducedGradients
from .stage_error import StageError
from .step_record import StepRecord


@dataclass
class _Probe:
    """What one microbatch leaves for the re-fit statistic (docs/algorithms.md 1.7)."""

    h_in: torch.Tensor  # the decoded input activation; its .grad is g = dL/dh_in (grad_cov, riemannian)
    z_in: torch.Tensor | None  # the received boundary tensor (riemannian)
    act: torch.Tensor | None = None  # act_cov: this microbatch's Delta^T (Delta U) / N, taken in forward


@dataclass
class _Pending:
    z_in: torch.Tensor | None  # the received boundary tensor (leaf, requires grad) or None on stage 0
    out: torch.Tensor  # this stage's boundary output (graph kept for backward)
    probe: _Probe | None = None  # for the re-fit statistic, added in when the microbatch's backward is done
    created: float = field(default_factory=time.monotonic)


class StageRunner(ReducedGradients, ScaledGradients, BasisVersions):
    def __init__(self, spec: RunSpec, stage: int, device: str | torch.device = "cpu",
                 basis: SubspaceBasis | None = None, checkpointing: bool = False, compile_blocks: bool = False) -> None:
        """`checkpointing`: keep only each block's input for backward and recompute the rest there
        (less memory, about one more forward pass; the same numbers). `compile_blocks`: `torch.compile` each
        block (fused elementwise work around the matmuls: faster, and rounding other than the eager kernels' by
        more than the spot checks allow in bf16, so it is the run's choice, `compile_blocks` in its spec)."""
        self.spec, self.stage, self.device = spec, stage, torch.device(device)
        self.dtype = compute_dtype(spec)
        basis = basis if basis is not None else spec_basis(spec)
        self.module: StageModule = build_stage(spec, stage, basis).to(self.device)
        self.module.checkpointing = checkpointing
        if compile_blocks:
            self.module.compile_blocks()
        self.optimizer = make_optimizer(spec, self.module)
        self.params = [p for p in self.module.parameters() if p.requires_grad]  # the order of flat gradients
        self.n_params = sum(p.numel() for p in self.params)
        # how gradients travel between replicas: constrained ones in subspace coordinates
        self.layout = SyncLayout.for_module(self.module, spec.rank if basis is not None else None)
        self.reduced: Reduced | None = None
        self.step = 0  # the step whose gradients are being accumulated
        self._pending: dict[int, _Pending] = {}
        # the gradients were loaded (`load_flat_grads`: a sum other replicas apply too), and from the layout
        self.grads_shared = self.grads_in_span = False
        self._backward_done: set[int] = set()
        self._constrained = {id(p): k for _, p, k in self.module.constrained_parameters()}
        self.basis = basis.to(self.device, self.dtype) if basis is not None else None
        self.basis_updated_step = 0
        self._scheduled: tuple[SubspaceBasis, int] | None = None  # (next basis, step it takes effect)
        self.last_truncation = 0.0  # ||(I - P_new) W|| / ||W|| at the last switch
        # (first step, version) of every basis this stage has used; messages of a step carry its version
        self.version_history: list[tuple[int, int]] = [(0, self.basis_version)]
        # docs/algorithms.md 1.7: receiving stages keep EMA(M_s), M_s the statistic RunSpec.refit_statistic names
        self.collect_stats = (spec.codec == "subspace" and spec.basis_updates and not self.is_first)
        self.stat = torch.zeros(spec.d_model, spec.rank, dtype=torch.float64, device=self.device) \
            if self.collect_stats else None
        self._step_stat = torch.zeros_like(self.stat) if self.stat is not None else None
        self.loss_scale = loss_scale_for(spec)  # fp16 runs: the scale every stage agrees on
        self.overflow_mbs: set[int] = set()  # microbatches of this step whose boundary gradient overflowed
        self.skipped_steps: list[int] = []  # the last steps skipped for an overflow (newest last)

    @property
    def is_first(self) -> bool:
        return self.module.is_first

    @property
    def is_last(self) -> bool:
        return self.module.is_last

    @property
    def basis_version(self) -> int:
        return self.module.basis_version

    def _check_step(self, step: int, microbatch: int, tokens: torch.Tensor) -> None:
        if step != self.step:
            raise StageError(f"stage {self.stage} is on step {self.step}, not {step}.")
        if not 0 <= microbatch < self.spec.n_microbatches:
            raise StageError(f"microbatch {microbatch} is outside 0..{self.spec.n_microbatches - 1}.")
        # every microbatch weighs 1 / n of the step's loss: one of fewer sequences would count its tokens more
        if tokens.shape[0] != self.spec.microbatch_size:
            raise StageError(f"microbatch {microbatch} holds {self.spec.microbatch_size} sequences, not "
                             f"{tokens.shape[0]}.")
        if microbatch in self._pending or microbatch in self._backward_done:
            raise StageError(f"microbatch {microbatch} of step {step} was already received.")

    def _input(self, z_in: torch.Tensor | None) -> torch.Tensor | None:
        if z_in is None:
            if not self.is_first:
                raise StageError(f"stage {self.stage} needs a boundary tensor.")
            return None
        return z_in.to(self.device, self.dtype).detach().requires_grad_(True)

    def output(self, tokens: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        """The stage's output for `tokens` [B, T+1] and boundary input `z`, no statistic collected (a recomputation)."""
        return self.module.leave(self.module.body(self.module.enter(tokens[:, :-1], z)), tokens[:, :-1])

    def _run_module(self, tokens: torch.Tensor, z: torch.Tensor | None) -> tuple[torch.Tensor, _Probe | None]:
        if not self.collect_stats or not self.spec.in_stat_window(self.step):
            return self.output(tokens, z), None
        inp = tokens[:, :-1]
        h = self.module.enter(inp, z)
        probe = _Probe(h, z)
        if self.spec.refit_statistic == "act_cov":
            out = self.module.body(h)
            delta = (out - h).detach().reshape(-1, h.shape[-1]).to(torch.float64)
            # C_s U with C_s = mean_tokens delta delta^T: where this stage writes into the residual stream
            probe.act = delta.T @ (delta @ self.basis.U.to(torch.float64)) / delta.shape[0]
            return self.module.leave(out, inp), probe
        h.retain_grad()
        return self.module.leave(self.module.body(h), inp), probe

    def _accumulate_stat(self, probe: _Probe | None) -> None:
        """Add one microbatch's M_s (averaged over the step's microbatches) once its backward is done."""
        if probe is None or self.basis is None:
            return
        kind, n_mb = self.spec.refit_statistic, self.spec.n_microbatches
        if kind == "act_cov":
            self._step_stat += probe.act / n_mb
            return
        h = probe.h_in
        if h.grad is None:
            return
        g = h.grad.detach().reshape(-1, h.shape[-1]).to(torch.float64) / self.scale
        if kind == "riemannian":
            # -dL/dU of the decoder h = z U^T + T_fixed[tok]: -sum_tokens g z^T, a descent direction for U
            z = probe.z_in.detach().reshape(-1, probe.z_in.shape[-1]).to(torch.float64)
            self._step_stat -= (g.T @ z) / (g.shape[0] * n_mb)
            return
        # C_s U with C_s = mean_tokens g^T g, averaged over the step's microbatches
        self._step_stat += (g.T @ (g @ self.basis.U.to(torch.float64))) / (g.shape[0] * n_mb)

    def forward(self, step: int, microbatch: int, tokens: torch.Tensor,
                z_in: torch.Tensor | None = None) -> torch.Tensor:
        """Non-last stage: returns the boundary tensor to send (detached); keeps the graph."""
        if self.is_last:
            raise StageError("the last stage runs forward_backward, not forward.")
        self._check_step(step, microbatch, tokens)
        tokens = tokens.to(self.device)
        z = self._input(z_in)
        out, probe = self._run_module(tokens, z)
        self._pending[microbatch] = _Pending(z, out, probe)
        return out.detach()

    def forward_backward(self, step: int, microbatch: int, tokens: torch.Tensor,
                         z_in: torch.Tensor | None) -> tuple[float, torch.Tensor | None]:
        """Last stage: loss on the shifted tokens, backward; returns (loss, dL/dz_in)."""
        if not self.is_last:
            raise StageError("only the last stage computes the loss.")
        self._check_step(step, microbatch, tokens)
        tokens = tokens.to(self.device)
        z = self._input(z_in)
        logits, probe = self._run_module(tokens, z)
        loss = lm_loss(logits, tokens[:, 1:])
        scaled = loss / self.spec.n_microbatches
        (scaled if self.loss_scale is None else scaled * self.loss_scale.scale).backward()
        self._accumulate_stat(probe)
        self._backward_done.add(microbatch)
        return float(loss.detach()), (z.grad.detach() if z is not None else None)

    def backward(self, step: int, microbatch: int, grad_out: torch.Tensor,
                 overflow: bool = False) -> torch.Tensor | None:
        """Non-last stage: backprop the received dL/dz_out; returns dL/dz_in (None on stage 0).
        `overflow`: the sender's gradient overflowed (fp16) and the zeros it sent stand in for it."""
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
        if overflow:
            self.overflow_mbs.add(microbatch)
        pending.out.backward(grad_out)
        self._accumulate_stat(pending.probe)
        self._backward_done.add(microbatch)
        return pending.z_in.grad.detach() if pending.z_in is not None else None

    def pending_shape(self, microbatch: int) -> tuple[int, ...] | None:
        """Shape of the boundary output waiting for its gradient, or None if none waits."""
        p = self._pending.get(microbatch)
        return tuple(p.out.shape) if p is not None else None

    def has_seen(self, microbatch: int) -> bool:
        """Whether this step's microbatch already went through forward here (waiting or done)."""
        return microbatch in self._pending or microbatch in self._backward_done

    def step_ready(self) -> bool:
        return len(self._backward_done) == self.spec.n_microbatches

    def _projected(self, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        kind = self._constrained.get(id(p))
        U = self.optimizer.U
        if kind == "col":
            return portable_project_cols(g, U) if self.grads_shared else project_cols(g, U)
        if kind == "row":
            return portable_project_rows(g, U) if self.grads_shared else project_rows(g, U)
        return g

    def optimizer_step(self, skip: bool = False) -> StepRecord:
        """Alone: clip, step and zero the gradients once every microbatch is through backward
        (`skip`: an overflow somewhere in the pipeline, `ScaledGradients.overflowed`)."""
        if not self.step_ready():
            raise StageError(f"step {self.step} has {len(self._backward_done)} of "
                             f"{self.spec.n_microbatches} microbatches through backward.")
        return self._step(skip)

    def _step(self, skip: bool = False) -> StepRecord:
        """Unscale, clip, step and zero the gradients; the stage moves on to the next step. A
        skipped step (fp16 overflow anywhere) leaves weights, moments and the re-fit statistic as
        they were and halves the loss scale; the step counter, the lr schedule and the data move on."""
        lr = lr_at(self.spec, self.step)
        if skip:
            norm = float("nan")
            self.skipped_steps = [*self.skipped_steps[-63:], self.step]
        else:
            self.unscale()
            # a sum other replicas apply too (it was loaded: a reduce's, a forwarded one) is applied by portable
            # operations, the same bits on any machine; a lone replica's own gradients by torch's faster ones
            shared, in_span = self.grads_shared, self.grads_in_span
            norm = clip_grad_norm(self.params, self.spec.grad_clip, None if in_span else self._projected, shared)
            set_lr(self.optimizer, lr, stage_lr_ratio(self.spec, self.step))
            self.optimizer.step(in_span=in_span, portable=shared)
        self.grads_in_span = self.grads_shared = False
        self.optimizer.zero_grad(set_to_none=True)
        if self.loss_scale is not None:
            self.loss_scale.update(skip)
        record = StepRecord(self.step, norm, lr, skip)
        collected = self.spec.in_stat_window(self.step)
        self.step += 1
        self._backward_done.clear()
        self.overflow_mbs.clear()
        self.reduced = None
        if self.stat is not None:
            if not collected:  # outside the window before a re-fit the EMA waits at zero (RunSpec.stat_window)
                self.stat.zero_()
            elif not skip:
                d = self.spec.stats_decay
                self.stat.mul_(d).add_(self._step_stat * (1 - d))  # unfused: the same bits on every machine
            self._step_stat.zero_()
        self._maybe_switch()
        return record

    def drop_stale(self, max_age_s: float) -> int:
        """Forget forward passes whose gradient never came (the peer downstream died)."""
        now = time.monotonic()
        stale = [m for m, p in self._pending.items() if now - p.created > max_age_s]
        for m in stale:
            del self._pending[m]
        return len(stale)

    def abort_step(self) -> None:
        """Throw away this step's partial work (pending graphs, accumulated gradients, a reduced sum)."""
        self._pending.clear()
        self._backward_done.clear()
        self.overflow_mbs.clear()
        self.optimizer.zero_grad(set_to_none=True)
        self.grads_shared = self.grads_in_span = False
        self.reduced = None
        if self._step_stat is not None:
            self._step_stat.zero_()

    def state_dict(self) -> dict:
        """Everything that makes this stage what it is at the start of its current step: weights,
        optimizer moments, step, basis (current and scheduled), the re-fit statistic and the loss scale. Partial
        work of the step in progress is not state: a stage that loads this redoes the step."""
        scheduled = None
        if self._scheduled is not None:
            scheduled = {"U": self._scheduled[0].U.cpu(), "version": self._scheduled[0].version,
                         "step": self._scheduled[1]}
        return {"spec": self.spec.to_json(), "stage": self.stage, "step": self.step,
                "basis_version": self.basis_version, "basis_updated_step": self.basis_updated_step,
                "version_history": list(self.version_history), "scheduled": scheduled,
                "U": self.basis.U.cpu() if self.basis is not None else None,
                "stat": self.stat.cpu() if self.stat is not None else None,
                "loss_scale": self.loss_scale.state_dict() if self.loss_scale is not None else None,
                "module": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("spec") != self.spec.to_json() or state.get("stage") != self.stage:
            raise StageError("checkpoint belongs to another run or stage; start without --resume.")
        if state.get("U") is not None and self.basis is not None:
            # the weights are already in span(U): point the codecs at it without re-projecting
            self.basis = SubspaceBasis(state["U"].to(self.device, self.dtype), self.basis.T_fixed,
                                       int(state["basis_version"]))
            self.module.switch_basis(self.basis, reproject=False)
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.basis is not None:
            self.optimizer.U = self.basis.U  # the restored moments are already in span(U): no re-projection
        if state.get("stat") is not None and self.stat is not None:
            self.stat.copy_(state["stat"])
        if self.loss_scale is not None and state.get("loss_scale") is not None:
            self.loss_scale.load_state_dict(state["loss_scale"])
        self.step = int(state["step"])
        self.basis_updated_step = int(state.get("basis_updated_step", 0))
        self.version_history = [tuple(v) for v in state.get("version_history") or [(0, self.basis_version)]]
        scheduled = state.get("scheduled")
        self._scheduled = None
        if scheduled is not None and self.basis is not None:
            U = scheduled["U"].to(self.device, self.dtype)  # already canonical: taken as it was scheduled
            self._scheduled = (SubspaceBasis(U, self.basis.T_fixed, int(scheduled["version"])), int(scheduled["step"]))
        self.abort_step()

"""The in-process pipeline: StageRunners chained through real wire bytes.

Every boundary, forward and backward, goes encode -> msgpack bytes -> decode (with the
receiver's validation) -> the next runner, exactly as it would between processes. It is the
oracle the networked swarm is compared against, and it counts the bytes it moved. In an fp16
run it takes the swarm's verdict the way the leading head does: a step in which any stage
overflowed is skipped by every stage (peer/runner/loss_scaling.py).

`schedule` (a bench option, not a run spec's: the swarm runs "sync" only) says at which weights a
step's gradient is taken (`SCHEDULES`):

- "sync" (the default, what the swarm does): W_{t+1} = W_t - update_t(grad f(W_t; batch_t));
- "stale1", one-step-stale weights as in PipeDream-2BW (issue 54 item 3): the gradient of step t is
  taken at the weights before the last update and applied to the current ones,
      W_{t+1} = W_t - update_t(grad f(W_{t-1}; batch_t)),  W_{-1} = W_0,
  the optimizer's state (moments, step count, lr schedule) advancing as usual. This is what lets a
  pipeline start step t+1 before step t's update is committed (swarm/bench/simulate/overlap.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from protocol.basis_update import next_basis
from protocol.codecs import WirePacker
from protocol.model import spec_basis
from protocol.spec import RunSpec
from protocol.subspace import SubspaceBasis
from protocol.wire import (
    ActivationMessage,
    GradientMessage,
    Header,
    WireLimits,
    decode_message,
    encode_message,
    tokens_for_wire,
)

from .stage import StageRunner

BatchFn = Callable[[int, int], torch.Tensor]  # (step, microbatch index) -> tokens [B, T+1]


@dataclass
class WireCount:
    forward_bytes: int = 0
    backward_bytes: int = 0
    forward_messages: int = 0
    backward_messages: int = 0
    tokens: int = 0  # tokens that crossed one boundary, summed over boundaries

    def per_token(self) -> dict[str, float]:
        n = max(1, self.tokens)
        return {"forward_bytes_per_token": self.forward_bytes / n, "backward_bytes_per_token": self.backward_bytes / n}


@dataclass
class StepResult:
    step: int
    loss: float
    tokens: int
    microbatch_losses: list[float] = field(default_factory=list)
    skipped: bool = False  # fp16: some stage overflowed and no stage stepped its optimizer


SCHEDULES = ("sync", "stale1")


class InProcessPipeline:
    def __init__(self, spec: RunSpec, device: str = "cpu", basis: SubspaceBasis | None = None,
                 serialize: bool = True, schedule: str = "sync") -> None:
        # serialize=False skips the msgpack bytes but keeps the wire dtype's rounding: the same
        # numbers (bit-equal on one thread), for long benchmarks where the bytes are not the question
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}.")
        if schedule != "sync" and spec.basis_updates:  # a re-fit re-projects W_t; W_{t-1} would be in the old span
            raise ValueError("the stale1 schedule needs a fixed basis (basis_updates false).")
        self.spec, self.serialize, self.schedule = spec, serialize, schedule
        self._previous: list[list[torch.Tensor]] | None = None  # stale1: W_{t-1} of every stage, before step t
        basis = basis if basis is not None else spec_basis(spec)
        self.runners = [StageRunner(spec, s, device, basis) for s in range(spec.n_stages)]
        self.packer = WirePacker.for_spec(spec)
        self.wire = WireCount()
        self.basis_log: list[tuple[int, int]] = []  # (version, effective step) of each re-fit
        # (receiving stage, microbatch, bytes) of every boundary message sent: what a receiver keeps
        # for a spot check of its share (swarm/bench/replicas/share_tolerance.py); serialize=True only
        self.tap: Callable[[int, int, bytes], None] | None = None

    def _limits(self, stage: int) -> WireLimits:
        return WireLimits.for_spec(self.spec, self.runners[stage].basis_version)

    def _header(self, step: int, mb: int, to_stage: int) -> Header:
        return Header(self.spec.run_hash, step, mb, self.runners[to_stage].version_for_step(step), self.spec.codec,
                      to_stage)

    def train_step(self, step: int, batch: BatchFn) -> StepResult:
        current = self._swap_in_previous() if self.schedule == "stale1" else None
        losses = []
        for mb in range(self.spec.n_microbatches):
            tokens = batch(step, mb)
            losses.append(self._microbatch(step, mb, tokens))
        if current is not None:  # the gradients (taken at W_{t-1}) stay; the update goes to W_t
            self._load(current)
        skip = any(r.overflowed() for r in self.runners)
        for r in self.runners:
            r.optimizer_step(skip)
        self._maybe_refit()
        return StepResult(step, sum(losses) / len(losses), tokens.shape[0] * self.spec.seq_len * len(losses), losses,
                          skip)

    def _swap_in_previous(self) -> list[list[torch.Tensor]] | None:
        """stale1: keep W_t (returned, and W_{t-1} of the next step) and load W_{t-1} for this step's passes;
        None at the first step, where W_{-1} = W_0 is already loaded."""
        current = [[p.detach().clone() for p in r.params] for r in self.runners]
        previous, self._previous = self._previous, current
        if previous is None:
            return None
        self._load(previous)
        return current

    @torch.no_grad()
    def _load(self, weights: list[list[torch.Tensor]]) -> None:
        for r, ws in zip(self.runners, weights):
            for p, w in zip(r.params, ws):
                p.copy_(w)

    def _microbatch(self, step: int, mb: int, tokens: torch.Tensor) -> float:
        if not self.serialize:
            return self._microbatch_direct(step, mb, tokens)
        z = None
        for s, runner in enumerate(self.runners[:-1]):
            out = runner.forward(step, mb, tokens, z)
            buf = encode_message(ActivationMessage(self._header(step, mb, s + 1),
                                                   tokens_for_wire(tokens, self.spec.vocab), self.packer.pack(out)))
            if self.tap is not None:
                self.tap(s + 1, mb, buf)
            self.wire.forward_bytes += len(buf)
            self.wire.forward_messages += 1
            self.wire.tokens += tokens.shape[0] * self.spec.seq_len
            msg = decode_message(buf, self._limits(s + 1))
            assert isinstance(msg, ActivationMessage)
            tokens = msg.tokens
            z = self.packer.unpack(msg.payload, self.runners[s + 1].dtype, self.runners[s + 1].device)
        loss, g = self.runners[-1].forward_backward(step, mb, tokens, z)
        for s in range(len(self.runners) - 2, -1, -1):
            g, overflow = self.runners[s + 1].boundary_gradient(mb, g)
            assert g is not None
            buf = encode_message(GradientMessage(self._header(step, mb, s), self.packer.pack(g), loss, overflow))
            if self.tap is not None:
                self.tap(s, mb, buf)
            self.wire.backward_bytes += len(buf)
            self.wire.backward_messages += 1
            msg = decode_message(buf, self._limits(s))
            assert isinstance(msg, GradientMessage)
            g = self.runners[s].backward(step, mb, self.packer.unpack(msg.payload, self.runners[s].dtype,
                                                                     self.runners[s].device), msg.overflow)
        return loss

    def _microbatch_direct(self, step: int, mb: int, tokens: torch.Tensor) -> float:
        z = None
        for runner in self.runners[:-1]:
            z = self.packer.roundtrip(runner.forward(step, mb, tokens, z))
        loss, g = self.runners[-1].forward_backward(step, mb, tokens, z)
        for s in range(len(self.runners) - 2, -1, -1):
            g, overflow = self.runners[s + 1].boundary_gradient(mb, g)
            g = self.runners[s].backward(step, mb, self.packer.roundtrip(g), overflow)
        return loss

    def _maybe_refit(self) -> None:
        """What the coordinator does, in process: gather the statistics at a re-fit step and
        schedule the next basis on every stage at step + basis_switch_delay."""
        receivers = self.runners[1:]
        if not receivers or not all(r.refit_due() for r in receivers):
            return
        U = next_basis(self.runners[0].basis.U, [r.refit_statistic() for r in receivers], self.spec)
        version = self.runners[0].basis_version + 1
        effective = self.runners[0].step + self.spec.basis_switch_delay
        self.basis_log.append((version, effective))
        for r in self.runners:
            r.schedule_basis(U, version, effective)

    def switch_basis(self, basis: SubspaceBasis) -> list[float]:
        return [r.switch_basis(basis) for r in self.runners]

"""The one-process reference: the same stages in one autograd graph, no bytes.

With `boundary=True` each boundary applies the codec's encode/decode and the wire's
precision loss (as a differentiable roundtrip), which is what a pipeline computes, so the
pipeline must match it to float tolerance. With `boundary=False` the stages are chained on
the raw hidden state, skipping encode/decode altogether: for the subspace codec that is the
"uncompressed constrained model", and matching it shows the compression is lossless.
Optimizers are per stage with per-stage clipping, as in the pipeline.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from protocol.codecs import WirePacker, WireRoundtrip
from protocol.model import build_stage, lm_loss, spec_basis
from protocol.optim import clip_grad_norm, lr_at, make_optimizer, set_lr, stage_lr_ratio
from protocol.spec import RunSpec
from protocol.subspace import SubspaceBasis, project_cols, project_rows


class ReferenceModel:
    def __init__(self, spec: RunSpec, device: str = "cpu", basis: SubspaceBasis | None = None,
                 boundary: bool = True) -> None:
        self.spec, self.boundary = spec, boundary
        basis = basis if basis is not None else spec_basis(spec)
        self.stages = [build_stage(spec, s, basis).to(device) for s in range(spec.n_stages)]
        self.optimizers = [make_optimizer(spec, m) for m in self.stages]
        self.packer = WirePacker.for_spec(spec)
        self.step = 0

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        inp = tokens[:, :-1]
        h = None
        z = None
        for m in self.stages:
            if self.boundary:
                z = m(inp, z)
                if not m.is_last:
                    z = WireRoundtrip.apply(z, self.packer)
            else:
                h = m.body(m.enter(inp, None) if m.is_first else m.add_table(h, inp))
                z = m.logits(h) if m.is_last else None
                h = m.strip_table(h, inp)
        return lm_loss(z, tokens[:, 1:])

    def train_step(self, batch: Callable[[int, int], torch.Tensor]) -> float:
        n = self.spec.n_microbatches
        losses = []
        for mb in range(n):
            loss = self.loss(batch(self.step, mb))
            (loss / n).backward()
            losses.append(loss.detach())  # read back after the last microbatch: no host sync in between
        total = sum(float(x) for x in losses)
        for m, opt in zip(self.stages, self.optimizers):
            kinds = {id(p): k for _, p, k in m.constrained_parameters()}

            def proj(p, g, kinds=kinds, U=opt.U):
                k = kinds.get(id(p))
                return project_cols(g, U) if k == "col" else project_rows(g, U) if k == "row" else g

            clip_grad_norm([p for p in m.parameters() if p.requires_grad], self.spec.grad_clip, proj)
            set_lr(opt, lr_at(self.spec, self.step), stage_lr_ratio(self.spec, self.step))
            opt.step()
            opt.zero_grad(set_to_none=True)
        self.step += 1
        return total / n

    def switch_basis(self, basis: SubspaceBasis) -> None:
        for m, opt in zip(self.stages, self.optimizers):
            m.switch_basis(basis)
            opt.set_basis(basis.U)

"""`SyncLayout`: how one stage's gradients travel between its replicas (docs/algorithms.md 5.1).

Every trainable parameter's gradient, flattened and concatenated in the module's parameter
order, except that a constrained weight's gradient travels in subspace coordinates:

    "col" W [d, n] (columns in span(U)):  G [d, n]  ->  C = U^T G  [k, n],  rebuilt as U C
    "row" T_S [V, d] (rows in span(U)):   G [V, d]  ->  C = G U    [V, k],  rebuilt as C U^T

The subspace AdamW consumes only P G (resp. G P), and U C = P G: the rebuilt gradient is the
one the optimizer would have used, so nothing it needs is lost, and k/d of the numbers cross
the wire. The rebuilt gradient lies in span(U) by construction, so the optimizer step keeps
the weights in the subspace however the coordinates were averaged. U is the basis of the step
the gradient belongs to; every replica of a stage is on the same basis at the same step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from protocol.portable_linalg import portable_matmul


@dataclass(frozen=True)
class SyncEntry:
    """One parameter's gradient as it travels: where it sits in the flat vector and its shape there."""

    shape: tuple[int, ...]  # the travelling shape (subspace coordinates for constrained weights)
    kind: str | None  # None, "col" or "row"
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class SyncLayout:
    def __init__(self, params: list[tuple[tuple[int, ...], str | None]], rank: int | None) -> None:
        """`params`: (full shape, constraint) of each trainable parameter, in flat order; `rank` is k."""
        self.full_shapes = [tuple(s) for s, _ in params]
        entries, off = [], 0
        for shape, kind in params:
            if kind == "col":
                travel = (rank, shape[1])
            elif kind == "row":
                travel = (shape[0], rank)
            else:
                travel = tuple(shape)
            entries.append(SyncEntry(travel, kind, off))
            off += math.prod(travel)
        self.entries: list[SyncEntry] = entries
        self.numel = off
        self.full_numel = sum(math.prod(s) for s in self.full_shapes)

    @classmethod
    def for_module(cls, module: torch.nn.Module, rank: int | None) -> SyncLayout:
        kinds = {id(p): k for _, p, k in getattr(module, "constrained_parameters", lambda: [])()}
        params = [(tuple(p.shape), kinds.get(id(p))) for p in module.parameters() if p.requires_grad]
        return cls(params, rank)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The travelling tensors inside a flat vector (views, no copies)."""
        return [flat[e.offset:e.offset + e.numel].view(e.shape) for e in self.entries]

    def pack(self, grads: list[torch.Tensor], U: torch.Tensor | None) -> torch.Tensor:
        """Full gradients, in flat order -> one flat vector in travelling coordinates."""
        out = []
        for e, g in zip(self.entries, grads):
            g = g.detach()
            if e.kind == "col":
                g = U.T @ g
            elif e.kind == "row":
                g = g @ U
            out.append(g.reshape(-1))
        return torch.cat(out) if out else torch.zeros(0)

    def unpack(self, flat: torch.Tensor, U: torch.Tensor | None) -> list[torch.Tensor]:
        """A flat vector in travelling coordinates -> full gradients (constrained ones rebuilt in span(U))."""
        if flat.numel() != self.numel:
            raise ValueError(f"a flat gradient of {flat.numel()} numbers does not fit a layout of {self.numel}.")
        out = []
        for e, v, shape in zip(self.entries, self.views(flat), self.full_shapes):  # what replicas apply: portable
            if e.kind == "col":
                v = portable_matmul(U, v, v.dtype)
            elif e.kind == "row":
                v = portable_matmul(v, U.T, v.dtype)
            out.append(v.reshape(shape))
        return out

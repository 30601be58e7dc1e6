"""Learned per-stage projections at the boundaries (issue 24 item 2), a `swarm bench fidelity` diagnostic.

Not a codec yet: it answers, in one process, whether learning each boundary's projection closes the per-token
gap enough to be worth building into the wire. The stages are free (a dense run spec: no span(U) constraint),
and boundary i (between stage i and i+1) is

    U_i = qr(W_i).Q (d x k, orthonormal, sign-fixed),   z = (h - A_i[tok]) U_i,   h' = A_i[tok] + U_i z,

so the receiver rebuilds exactly the part of h - A_i[tok] that lies in span(U_i) (Protocol Models' exact
reconstruction, MDCP-PP's learned Stiefel projection). A_i is the boundary's anchor: a per-boundary token
table (V x d) both ends add back for free, since both know the tokens. Variants (`Job.boundary`):

- `learned`:        W_i and A_i trained (A_i from zero),
- `learned-noanchor`: W_i trained, no anchor (A_i = 0),
- `learned-fixedu`: W_i frozen at its random start, A_i trained (what learning U adds, by difference),
- `learned-projlr1`: as `learned`, W_i and A_i at the global lr (no weight decay) whatever the stage's own lr.

U_i's gradient has two halves, the sender's (h - A)^T dL/dz and the receiver's (dL/dh')^T z; here both
accumulate into one W_i.grad because sender and receiver share the tensor in one process. The swarm would have
to ship the receiver's half back with each gradient message (d x k numbers) and the step's U_i forward with the
first activation message (docs/fidelity.md section 6). W_i and A_i are parameters of the sending stage: its
optimizer, clipping and lr (`constrained_stage_lr_scale` included) are theirs, but for `learned-projlr1`.
"""
from __future__ import annotations

import torch
from torch import nn

from peer.runner.pipeline import InProcessPipeline
from protocol.codecs import BoundaryDecoder, BoundaryEncoder
from protocol.optim import make_optimizer
from protocol.subspace import orthonormalize

LEARNED_BOUNDARIES = ("learned", "learned-noanchor", "learned-fixedu", "learned-projlr1")


class LearnedProjection(nn.Module):
    """One boundary's W (d x k; U = qr(W).Q) and anchor table A (V x d), owned by the sending stage."""

    def __init__(self, d: int, k: int, vocab: int, seed: int, learn_u: bool = True, anchor: bool = True) -> None:
        super().__init__()
        g = torch.Generator(device="cpu").manual_seed(seed)
        W = orthonormalize(torch.randn(d, k, generator=g, dtype=torch.float64)).float()
        self.W = nn.Parameter(W, requires_grad=learn_u)
        self.A = nn.Parameter(torch.zeros(vocab, d)) if anchor else None

    def basis(self) -> torch.Tensor:
        """U = qr(W).Q with diag(R) > 0, in fp32 whatever the autocast: differentiable in W."""
        with torch.autocast(self.W.device.type, enabled=False):
            return orthonormalize(self.W)

    def anchor(self, tokens: torch.Tensor, like: torch.Tensor) -> torch.Tensor | float:
        return self.A[tokens].to(like.dtype) if self.A is not None else 0.0


class LearnedEncoder(BoundaryEncoder):
    def __init__(self, proj: LearnedProjection) -> None:
        super().__init__()
        self.proj = proj  # registered: the sending stage's optimizer trains it
        self.width = proj.W.shape[1]

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return (h - self.proj.anchor(tokens, h)) @ self.proj.basis().to(h.dtype)


class LearnedDecoder(BoundaryDecoder):
    def __init__(self, proj: LearnedProjection) -> None:
        super().__init__()
        self._shared = (proj,)  # a tuple, so the receiving stage does not register (and step) it a second time
        self.width = proj.W.shape[1]

    def forward(self, z: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        proj = self._shared[0]
        return z @ proj.basis().to(z.dtype).T + proj.anchor(tokens, z)


def learned_boundaries(pipe: InProcessPipeline, variant: str) -> None:
    """Every boundary of `pipe` (a dense run spec) becomes a learned projection of width `spec.rank`; each
    sending stage's optimizer and gradient list are rebuilt to hold its boundary's W and A."""
    spec = pipe.spec
    if variant not in LEARNED_BOUNDARIES:
        raise ValueError(f"unknown learned boundary {variant!r}: use one of {', '.join(LEARNED_BOUNDARIES)}.")
    if spec.codec != "dense":
        raise ValueError("learned boundaries replace a dense run's boundaries: give the job a dense spec "
                         "(its rank is the boundary's width k).")
    for i, (sender, receiver) in enumerate(zip(pipe.runners, pipe.runners[1:])):
        proj = LearnedProjection(spec.d_model, spec.rank, spec.vocab, spec.seed * 1000 + i,
                                 learn_u=variant != "learned-fixedu", anchor=variant != "learned-noanchor")
        proj = proj.to(sender.device, next(sender.module.parameters()).dtype)
        sender.module.encoder = LearnedEncoder(proj)
        receiver.module.decoder = LearnedDecoder(proj)
        sender.optimizer = make_optimizer(spec, sender.module)
        if variant == "learned-projlr1":  # W and A leave the stage's groups for one at the global lr
            own = {id(p) for p in proj.parameters()}
            for group in sender.optimizer.param_groups:
                group["params"] = [p for p in group["params"] if id(p) not in own]
            sender.optimizer.add_param_group(dict(params=[p for p in proj.parameters() if p.requires_grad],
                                                  weight_decay=0.0))
        sender.params = [p for p in sender.module.parameters() if p.requires_grad]
        sender.n_params = sum(p.numel() for p in sender.params)

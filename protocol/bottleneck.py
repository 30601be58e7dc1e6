"""The ResBM residual bottleneck (docs/algorithms.md section 2).

A small trainable encoder at the end of a stage and decoder at the start of the next, each
with an explicit low-rank identity path. Both output layers start at zero, so at init the
boundary is exactly pad(trunc(h)) and training grows the learned part from there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x / sqrt(mean(x^2) + eps) * weight, as one fused kernel where torch has one."""
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class ResBMEncoder(nn.Module):
    """z = Enc(h) + h[..., :b]: [B, T, d] -> [B, T, b]."""

    def __init__(self, d: int, b: int) -> None:
        super().__init__()
        self.b = b
        self.norm = RMSNorm(d)
        self.up = nn.Linear(d, 4 * b, bias=False)
        self.down = nn.Linear(4 * b, b, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(self.norm(h)))) + h[..., : self.b]


class ResBMDecoder(nn.Module):
    """h' = Dec(z) + pad_d(z): [B, T, b] -> [B, T, d]."""

    def __init__(self, d: int, b: int) -> None:
        super().__init__()
        self.d = d
        self.up = nn.Linear(b, 4 * b, bias=False)
        self.down = nn.Linear(4 * b, d, bias=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(z))) + F.pad(z, (0, self.d - z.shape[-1]))


def zero_init_outputs(enc: ResBMEncoder | None, dec: ResBMDecoder | None) -> None:
    """Zero the output layers so the boundary starts as the identity path alone."""
    with torch.no_grad():
        for m in (enc, dec):
            if m is not None:
                m.down.weight.zero_()

"""Residual vector quantization of the hybrid's lossy part (issue 24 item 2, MDCP-PP's last lever), a
`swarm bench fidelity` diagnostic measured in one process before anything is built into the wire.

The hybrid (protocol/codecs.py) sends per token k exact coordinates c = r U and b bf16 numbers
y = Enc(r - U U^T r) of what the stage wrote outside span(U). Here y has e numbers and is sent as M one-byte
codes instead, so a token costs 2k + M bytes forward (the hybrid: 2(k + b)):

    q_0 = 0,   i_m = argmin_j || y - q_m - C_m[j] ||,   q_{m+1} = q_m + C_m[i_m]   (m = 0 .. M-1),
    z = [c, q_M]  on the wire as (c in bf16, i_0 .. i_{M-1}),   h' = HybridDecoder(z)  unchanged.

The codebooks C_m (K = 256 codewords in R^e each) are not trained by gradients: each is the EMA k-means of the
residuals it was asked to code (decay `decay`, dead codewords restarted from a coded residual), started from
the first step's own residuals. The gradient passes q to y unchanged (straight-through) plus the commitment
term beta d/dy ||y - q||^2 / (tokens a step), which keeps Enc's output near its codewords. The receiver's
gradient for the e numbers comes back in bf16 as the hybrid's does, so backward costs 2(k + e) bytes a token.
The k exact coordinates stay exact (the decoder's U^T of the rebuilt residual is c; tests/swarm/
test_rvq_boundary.py). In a swarm the sender owns the codebooks and would ship them (M K e numbers) to the
receiver when they change, as the coordinator ships a basis: M = 8, e = 8 is 32 KB a step in bf16, under 6% of
`small`'s 8192 tokens x 64 bytes.

Variants (`Job.boundary`): `rvq4`, `rvq8`, `rvq16` (M), on a hybrid spec whose `rank` is k and whose
`residual_width` is e.
"""
from __future__ import annotations

import torch
from torch import nn

from peer.runner.pipeline import InProcessPipeline
from protocol.codecs import BoundaryEncoder, HybridEncoder
from protocol.spec import WIRE_DTYPES, RunSpec

RVQ_BOUNDARIES = {"rvq4": 4, "rvq8": 8, "rvq16": 16}
CODEWORDS = 256  # one byte a code


class _StraightThrough(torch.autograd.Function):
    """Forward q; backward g + beta 2 (y - q) / n to y (the commitment loss beta ||y - q||^2 / n)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, q: torch.Tensor, commit: float) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(y, q)
        ctx.commit = commit
        return q.to(y.dtype)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        y, q = ctx.saved_tensors
        return g + (2.0 * ctx.commit) * (y - q.to(y.dtype)), None, None


class ResidualVQ(nn.Module):
    """M codebooks of K codewords in R^e, each the EMA k-means of the residual it codes (module docstring)."""

    def __init__(self, e: int, m: int, seed: int, k: int = CODEWORDS, decay: float = 0.95,
                 beta: float = 0.25, tokens_per_step: int = 1) -> None:
        super().__init__()
        self.e, self.m, self.k, self.decay = e, m, k, decay
        self.commit = beta / tokens_per_step
        self.seed = seed
        self.register_buffer("codebooks", torch.zeros(m, k, e))
        self.register_buffer("counts", torch.zeros(m, k))
        self.register_buffer("sums", torch.zeros(m, k, e))
        self.register_buffer("started", torch.zeros((), dtype=torch.bool))
        self.learning = True  # False holds the codebooks still (a test's fixed codec)
        self._gen: torch.Generator | None = None

    def _rows(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """n rows of x drawn without replacement (with, if x has fewer), from the module's own generator."""
        if self._gen is None or self._gen.device != x.device:
            self._gen = torch.Generator(device=x.device).manual_seed(self.seed)
        if x.shape[0] >= n:
            idx = torch.randperm(x.shape[0], generator=self._gen, device=x.device)[:n]
        else:
            idx = torch.randint(x.shape[0], (n,), generator=self._gen, device=x.device)
        return x[idx]

    @torch.no_grad()
    def quantize(self, y: torch.Tensor, learn: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, codes [rows, M] as uint8) for y [..., e]; `learn` moves the codebooks (a training step)."""
        flat = y.detach().reshape(-1, self.e).float()
        if learn and not bool(self.started):
            self._start(flat)
        residual, q = flat.clone(), torch.zeros_like(flat)
        codes = torch.empty(flat.shape[0], self.m, dtype=torch.uint8, device=flat.device)
        for m in range(self.m):
            book = self.codebooks[m]
            idx = torch.cdist(residual, book).argmin(dim=1)
            if learn:
                self._update(m, residual, idx)
            chosen = self.codebooks[m][idx]
            codes[:, m] = idx.to(torch.uint8)
            q += chosen
            residual -= chosen
        return q.reshape(y.shape), codes

    def _start(self, flat: torch.Tensor) -> None:
        """Each codebook starts as K of the residuals it will code: k-means' data start, stage by stage."""
        residual = flat.clone()
        for m in range(self.m):
            self.codebooks[m] = self._rows(residual, self.k)
            idx = torch.cdist(residual, self.codebooks[m]).argmin(dim=1)
            self.counts[m] = torch.bincount(idx, minlength=self.k).float()
            self.sums[m] = self.codebooks[m] * self.counts[m, :, None]
            residual -= self.codebooks[m][idx]
        self.started.fill_(True)

    def _update(self, m: int, residual: torch.Tensor, idx: torch.Tensor) -> None:
        """EMA of each codeword's count and sum; C = sum / count; a codeword used < 1/64 of its share restarts."""
        onehot_count = torch.bincount(idx, minlength=self.k).float()
        coded = torch.zeros(self.k, self.e, device=residual.device).index_add_(0, idx, residual)
        self.counts[m].mul_(self.decay).add_(onehot_count, alpha=1 - self.decay)
        self.sums[m].mul_(self.decay).add_(coded, alpha=1 - self.decay)
        self.codebooks[m] = self.sums[m] / self.counts[m].clamp_min(1e-6)[:, None]
        dead = self.counts[m] < residual.shape[0] / self.k / 64
        n_dead = int(dead.sum())
        if n_dead:
            fresh = self._rows(residual, n_dead)
            self.codebooks[m][dead] = fresh
            self.sums[m][dead] = fresh
            self.counts[m][dead] = 1.0

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        q, _ = self.quantize(y, learn=self.learning and torch.is_grad_enabled() and y.requires_grad)
        return _StraightThrough.apply(y, q, self.commit)


class RVQHybridEncoder(BoundaryEncoder):
    """The hybrid's encoder with its e lossy numbers replaced by their M-code RVQ reconstruction."""

    def __init__(self, hybrid: HybridEncoder, vq: ResidualVQ) -> None:
        super().__init__()
        self.hybrid, self.vq = hybrid, vq
        self.width = hybrid.width
        self.k = hybrid.U.shape[1]

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        z = self.hybrid(h, tokens)
        return torch.cat([z[..., : self.k], self.vq(z[..., self.k:])], dim=-1)


def rvq_boundaries(pipe: InProcessPipeline, variant: str, beta: float = 0.25) -> None:
    """Every boundary of `pipe` (a hybrid spec: rank k, residual_width e) codes its e numbers with M codes."""
    spec = pipe.spec
    if variant not in RVQ_BOUNDARIES:
        raise ValueError(f"unknown RVQ boundary {variant!r}: use one of {', '.join(RVQ_BOUNDARIES)}.")
    if not spec.hybrid:
        raise ValueError("RVQ boundaries code a hybrid's residual numbers: give the job a subspace spec with "
                         "residual_width > 0 (its e).")
    for i, runner in enumerate(pipe.runners[:-1]):
        enc = runner.module.encoder
        assert isinstance(enc, HybridEncoder)
        vq = ResidualVQ(spec.residual_width, RVQ_BOUNDARIES[variant], seed=spec.seed * 1000 + i, beta=beta,
                        tokens_per_step=spec.batch_size * spec.seq_len).to(runner.device)
        runner.module.encoder = RVQHybridEncoder(enc, vq)


def rvq_forward_bytes(spec: RunSpec, variant: str) -> int:
    """Bytes a token forward: k exact numbers in the wire dtype and one byte per code."""
    return spec.rank * WIRE_DTYPES[spec.wire_dtype].itemsize + RVQ_BOUNDARIES[variant]

"""The shared subspace of Protocol Models (docs/algorithms.md section 1).

`U` (d x k, orthonormal) and the frozen token embedding `T_fixed` (V x d) are generated
from the run's seed on the CPU in float64 with one generator in a fixed draw order, so every
peer holds the same constants without any bytes of them travelling; their hash is checked
at start-up. Also here: projections onto span(U), principal angles, and the Grassmann
retraction step that re-fits U (a pure function; its scheduling is the swarm's business).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from protocol.portable_linalg import portable_matmul, portable_orthonormalize

T_FIXED_STD = 0.02


@dataclass
class SubspaceBasis:
    """One version of the shared basis. `U` and `T_fixed` are in the compute dtype."""

    U: torch.Tensor  # [d, k], U^T U = I
    T_fixed: torch.Tensor  # [V, d], frozen and high-rank
    version: int = 0

    @property
    def rank(self) -> int:
        return self.U.shape[1]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> SubspaceBasis:
        return SubspaceBasis(self.U.to(device=device, dtype=dtype), self.T_fixed.to(device=device, dtype=dtype),
                             self.version)

    def hash(self) -> str:
        """Hash of U and T_fixed as float32 bytes: equal on every peer of a run, or the peer refuses."""
        h = hashlib.sha256()
        for t in (self.U, self.T_fixed):
            h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()[:16]


def orthonormalize(A: torch.Tensor) -> torch.Tensor:
    """QR with signs fixed so diag(R) > 0: a unique orthonormal basis of span(A)."""
    Q, R = torch.linalg.qr(A)
    signs = torch.sign(torch.diagonal(R))
    signs[signs == 0] = 1
    return Q * signs


def make_basis(d: int, k: int, vocab: int, seed: int, dtype: torch.dtype = torch.float32,
               t_fixed_std: float = T_FIXED_STD) -> SubspaceBasis:
    """U and T_fixed from one seed; T_fixed's entries have standard deviation `t_fixed_std` (RunSpec)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    # every peer derives U from the seed: the portable QR, so it is the same bits on any machine (LAPACK's QR
    # is not: its bits change with the thread count and the library), drawn in fp64 (fp32 randn depends on the
    # CPU's vector unit)
    (U,) = portable_orthonormalize([torch.randn(d, k, generator=g, dtype=torch.float64)])
    T_fixed = torch.randn(vocab, d, generator=g, dtype=torch.float64) * t_fixed_std
    return SubspaceBasis(U.to(dtype), T_fixed.to(dtype), version=0)


def project_cols(W: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """P W: keeps the column (output) space of W inside span(U)."""
    return U @ (U.T @ W)


def project_rows(T: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """T P: keeps the rows of T inside span(U)."""
    return (T @ U) @ U.T


def portable_project_cols(W: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """P W as the same bits on every machine (`protocol/portable_linalg.py`): for what a stage's replicas
    must agree on (their weights, moments and applied gradients), not for the boundary's hot path."""
    return portable_matmul(U, portable_matmul(U.T, W, W.dtype), W.dtype)


def portable_project_rows(T: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """T P as the same bits on every machine (see `portable_project_cols`)."""
    return portable_matmul(portable_matmul(T, U, T.dtype), U.T, T.dtype)


def out_of_subspace(W: torch.Tensor, U: torch.Tensor, rows: bool = False) -> float:
    """Relative norm of the part of W outside span(U): ||(I-P)W|| / ||W||."""
    W = W.detach()
    inside = project_rows(W, U) if rows else project_cols(W, U)
    return float((W - inside).norm() / W.norm().clamp_min(1e-300))


def principal_angles(U1: torch.Tensor, U2: torch.Tensor) -> torch.Tensor:
    """Principal angles between span(U1) and span(U2), ascending, in radians.

    From the sines (singular values of (I - U1 U1^T) U2): accurate for small angles,
    where acos of the cosines loses half the digits.
    """
    resid = U2 - U1 @ (U1.T @ U2)
    s = torch.linalg.svdvals(resid).clamp(0, 1)
    return torch.sort(torch.asin(s)).values


def grassmann_step(U: torch.Tensor, M: torch.Tensor, eta: float, max_angle: float = 0.05) -> torch.Tensor:
    """One Riemannian ascent step on tr(U^T C U) given M = C U (summed over stages).

    D = (I - U U^T) M is the Riemannian gradient; the retraction is qr(U + t D/||D||) with
    t = eta, shrunk by bisection until the largest principal angle is within `max_angle`.
    Returns U unchanged when D vanishes (U already spans an invariant subspace).
    """
    D = M - U @ (U.T @ M)
    norm = D.norm()
    if float(norm) <= 1e-12 * max(1.0, float(M.norm())):
        return U.clone()
    D = D / norm
    t = float(eta)
    for _ in range(60):
        U_new = orthonormalize(U + t * D)
        if float(principal_angles(U, U_new).max()) <= max_angle:
            return U_new
        t *= 0.5
    return U.clone()
